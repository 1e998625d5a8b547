// Text for the error messages of the readers of distrusted files: the .tinyloop loader (format.cpp) and the checkpoint
// importer (cpp/import/checkpoint_import.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tl {

// A tensor shape as "[2, 3]".
std::string shape_text(const std::vector<int64_t> &shape);

// How describe_json shows a value that is not a number.
enum class JsonDetail {
    Numbers,  // only numbers as written; anything else by its type, since a value of a distrusted file may be large
    Scalars,  // booleans as written and strings quoted too (config.json's fields)
};
// A JSON value for a message: numbers as written, and per `detail` booleans and strings; anything else by its type
// ("a array", "a object", "a null").
std::string describe_json(const nlohmann::json &value, JsonDetail detail = JsonDetail::Numbers);

}  // namespace tl

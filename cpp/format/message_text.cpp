#include "format/message_text.hpp"

#include <nlohmann/json.hpp>

namespace tl {

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string describe_json(const nlohmann::json &value, JsonDetail detail) {
    if (value.is_number()) return value.dump();
    if (detail == JsonDetail::Scalars) {
        if (value.is_boolean()) return value.dump();
        if (value.is_string()) return "'" + value.get<std::string>() + "'";
    }
    return std::string("a ") + value.type_name();
}

}  // namespace tl

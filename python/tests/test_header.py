"""The ctypes declarations of tinyloop._capi against capi/include/tinyloop.h: every struct field by field, every
declared function's signature, the status and backend constants and the version. A change to the header that the
package does not follow fails here, instead of misreading memory at run time."""

import ctypes
import re

import pytest

from conftest import REPO

import tinyloop._capi as capi

HEADER = (REPO / "capi" / "include" / "tinyloop.h").read_text()
CODE = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S))

SCALARS = {
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "uint16_t": ctypes.c_uint16, "uint8_t": ctypes.c_uint8, "size_t": ctypes.c_size_t, "float": ctypes.c_float,
    "double": ctypes.c_double, "char": ctypes.c_char, "tl_status": ctypes.c_int32,
    "tl_progress_fn": capi.tl_progress_fn,
}
OPAQUE = {"tl_model", "tl_weight", "void"}


def ctypes_of(c_type):
    """The ctypes type the package should use for a C type of the header (opaque pointers are c_void_p)."""
    c_type = c_type.replace("const", " ")
    stars = c_type.count("*")
    base = c_type.replace("*", " ").split()
    assert len(base) == 1, c_type
    base = base[0]
    if stars == 0:
        return None if base == "void" else SCALARS.get(base) or getattr(capi, base)
    if base == "char" and stars == 1:
        return ctypes.c_char_p
    if base in OPAQUE:
        result, stars = ctypes.c_void_p, stars - 1
    else:
        result = SCALARS.get(base) or getattr(capi, base)
    for _ in range(stars):
        result = ctypes.POINTER(result)
    return result


def describe(t):
    """A comparable description of a ctypes type."""
    if t is None:
        return "void"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return f"ptr({describe(t._type_)})"
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        return f"{describe(t._type_)}[{t._length_}]"
    if isinstance(t, type) and issubclass(t, ctypes._CFuncPtr):
        return f"fn({describe(t._restype_)}; {', '.join(describe(a) for a in t._argtypes_)})"
    return t.__name__


def header_structs():
    structs = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", CODE, flags=re.S):
        fields = []
        for declaration in body.split(";"):
            declaration = " ".join(declaration.split())
            if not declaration:
                continue
            match = re.fullmatch(r"(.*?)(\w+)(?:\[(\d+)\])?", declaration)
            c_type, field, length = match.groups()
            t = ctypes_of(c_type)
            fields.append((field, t * int(length) if length else t))
        structs[name] = fields
    return structs


STRUCTS = header_structs()
DECLARED = [name for name in dir(capi) if name.startswith("tl_") and isinstance(getattr(capi, name), type)
            and issubclass(getattr(capi, name), ctypes.Structure)]


def test_the_header_was_parsed():
    assert {"tl_score_options", "tl_score_result", "tl_sequence", "tl_model_properties"} <= set(STRUCTS)
    assert set(DECLARED) == {"tl_compare_options", "tl_compare_result", "tl_device_properties", "tl_load_options",
                             "tl_model_properties", "tl_score_options", "tl_score_result", "tl_sequence",
                             "tl_sequence_score"}


@pytest.mark.parametrize("name", DECLARED)
def test_struct_matches_the_header(name):
    declared = [(field, describe(t)) for field, t in getattr(capi, name)._fields_]
    expected = [(field, describe(t)) for field, t in STRUCTS[name]]
    assert declared == expected


@pytest.mark.parametrize("name", sorted(capi.FUNCTIONS))
def test_function_matches_the_header(name):
    match = re.search(r"TL_API\s+([\w\s\*]+?)\s*\b" + name + r"\(([^)]*)\);", CODE)
    assert match, f"{name} is not in the header"
    restype, arguments = match.groups()
    expected_args = [] if arguments.strip() in ("", "void") else [
        ctypes_of(re.sub(r"\w+\s*$", "", argument.strip())) for argument in arguments.split(",")]
    declared_restype, declared_args = capi.FUNCTIONS[name]
    assert describe(declared_restype) == describe(ctypes_of(restype))
    assert [describe(a) for a in declared_args] == [describe(a) for a in expected_args]


def test_progress_callback_type():
    match = re.search(r"typedef (\w+) \(\*tl_progress_fn\)\(([^)]*)\);", CODE)
    restype, arguments = match.groups()
    expected = ctypes.CFUNCTYPE(ctypes_of(restype),
                                *[ctypes_of(re.sub(r"\w+\s*$", "", a.strip())) for a in arguments.split(",")])
    assert describe(capi.tl_progress_fn) == describe(expected)


def test_constants_and_version():
    statuses = dict((int(value), name) for name, value in
                    re.findall(r"static const tl_status (TL_\w+) = (-?\d+);", CODE))
    assert statuses == capi.STATUS_NAMES
    backends = dict(re.findall(r"static const int32_t (TL_BACKEND_\w+) = (\d+);", CODE))
    assert {k: int(v) for k, v in backends.items()} == {
        "TL_BACKEND_AUTO": capi.TL_BACKEND_AUTO, "TL_BACKEND_CPU": capi.TL_BACKEND_CPU,
        "TL_BACKEND_CUDA": capi.TL_BACKEND_CUDA}
    tokenizers = dict(re.findall(r"static const int32_t (TL_TOKENIZER_\w+) = (\d+);", CODE))
    assert {k: int(v) for k, v in tokenizers.items()} == {
        "TL_TOKENIZER_BYTES": capi.TL_TOKENIZER_BYTES, "TL_TOKENIZER_HUGGINGFACE": capi.TL_TOKENIZER_HUGGINGFACE,
        "TL_TOKENIZER_SENTENCEPIECE": capi.TL_TOKENIZER_SENTENCEPIECE}
    version = tuple(int(re.search(rf"#define TL_VERSION_{part} (\d+)", HEADER).group(1))
                    for part in ("MAJOR", "MINOR", "PATCH"))
    assert version == capi.ABI_VERSION


def test_status_enum_follows_the_header(tinyloop):
    for value, name in capi.STATUS_NAMES.items():
        assert "TL_ERR_" + tinyloop.Status(value).name == name or (value == 0 and name == "TL_OK")

# SPDX-License-Identifier: Apache-2.0
"""Element types: the names devstage uses, and how DLPack, NumPy, PyTorch and the buffer protocol
spell them."""

# name -> (DLPack type code, bits, NumPy typestr). bfloat16 has no NumPy type: NumPy sees its
# elements as 2-byte void.
DTYPES = {
    "int8": (0, 8, "|i1"), "int16": (0, 16, "<i2"), "int32": (0, 32, "<i4"), "int64": (0, 64, "<i8"),
    "uint8": (1, 8, "|u1"), "uint16": (1, 16, "<u2"), "uint32": (1, 32, "<u4"), "uint64": (1, 64, "<u8"),
    "float16": (2, 16, "<f2"), "float32": (2, 32, "<f4"), "float64": (2, 64, "<f8"),
    "bfloat16": (4, 16, "|V2"), "bool": (6, 8, "|b1"),
}

# (DLPack code, bits) -> name.
BY_DLPACK = {(code, bits): name for name, (code, bits, _) in DTYPES.items()}

# NumPy typestr without the byte order -> name (little-endian hosts; "V2" is taken as bfloat16
# only where a dtype says so).
_BY_TYPESTR = {typestr[1:]: name for name, (_, _, typestr) in DTYPES.items() if name != "bfloat16"}

# Buffer-protocol (struct module) format characters -> name; "c" (char) counts as bytes.
_BY_FORMAT = {"b": "int8", "B": "uint8", "c": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32",
              "l": "int64", "L": "uint64", "q": "int64", "Q": "uint64", "e": "float16", "f": "float32",
              "d": "float64", "?": "bool"}


# name -> the buffer-protocol format characters of its elements, native size (a frame's checked
# write compares them, with the element size).
FORMAT_CHARS = {name: "".join(fmt for fmt, named in _BY_FORMAT.items() if named == name).encode() for name in DTYPES}


def dtype_name(dtype):
    """The name of a dtype given as a string, a NumPy dtype or scalar type, or a torch.dtype."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(getattr(dtype, "name", None), str):
        name = dtype.name            # numpy.dtype
    elif isinstance(getattr(dtype, "__name__", None), str):
        name = dtype.__name__        # numpy.float32 and the like
    else:
        name = str(dtype)            # torch.float32 -> "torch.float32"
    name = name.removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"devstage: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return name


def itemsize(name):
    return DTYPES[name][1] // 8


def from_typestr(typestr):
    """The name of a NumPy array-interface typestr ("<f4"), or None when devstage has no such type
    (or it is big-endian)."""
    if typestr[0] == ">" and typestr[2:] != "1":
        return None
    return _BY_TYPESTR.get(typestr[1:])


def from_format(fmt):
    """The name of a buffer-protocol format ("f", "<i", "=B"), or None for a format devstage does
    not know (a struct, a big-endian type)."""
    if fmt and fmt[0] in "@=<":
        fmt = fmt[1:]
    return _BY_FORMAT.get(fmt)

"""Text to tokens for byte-level models: one token per byte of the UTF-8 encoding.

The one place the package turns text into tokens. It is what `tinyloop score --text` and `score-batch`'s "text"
requests do, and what the demo model was trained on (models/demo-int4.tokenizer.json: token = byte value, vocab 256,
no special tokens). A model with another tokenizer takes token ids instead.
"""

import numpy as np


def encode(text):
    """The tokens of `text` as an int32 array: str is encoded as UTF-8, bytes-like objects are taken as they are."""
    if isinstance(text, str):
        data = text.encode("utf-8")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
    else:
        raise TypeError(f"text must be str or bytes-like, not {type(text).__name__}")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


def decode(tokens):
    """The bytes of byte-level tokens (values 0..255); decode them as UTF-8 yourself where they are text."""
    values = np.asarray(tokens)
    if values.size and (values.min() < 0 or values.max() > 255):
        raise ValueError("byte-level tokens must be in [0, 256)")
    return values.astype(np.uint8).tobytes()

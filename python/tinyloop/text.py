"""Text to tokens for byte-level models: one token per byte of the UTF-8 encoding.

What a model without a stored tokenizer reads (`tinyloop score --text` and `score-batch`'s "text" requests do the
same), and what the demo model was trained on (models/demo-int4.tokenizer.json: token = byte value, vocab 256, no
special tokens). Model.tokenize uses the model's own tokenizer, whatever it is; these functions need no model.
"""

import numpy as np


def as_bytes(text):
    """`text` as bytes: str encoded as UTF-8, bytes-like objects as they are."""
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError(f"text must be str or bytes-like, not {type(text).__name__}")


def encode(text):
    """The byte-level tokens of `text` as an int32 array: str is encoded as UTF-8, bytes-like objects are taken as
    they are."""
    return np.frombuffer(as_bytes(text), dtype=np.uint8).astype(np.int32)


def decode(tokens):
    """The bytes of byte-level tokens (values 0..255); decode them as UTF-8 yourself where they are text."""
    values = np.asarray(tokens)
    if values.size and (values.min() < 0 or values.max() > 255):
        raise ValueError("byte-level tokens must be in [0, 256)")
    return values.astype(np.uint8).tobytes()

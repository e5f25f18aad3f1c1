"""Sans-I/O envelope codec for MCP over Bison Relay PMs (WIRE.md).

One JSON-RPC message is split into chunks; each chunk travels as one PM
framed ``--mcp[v=1,sid=…,mid=…,seq=n/total,exp=…]--<base64>``. The
:class:`Assembler` puts multi-part messages back together under hard bounds.
No I/O, no event loop: callers pass text in and get bytes out.
"""

from .assembler import Assembler, AssemblerConfig
from .batch import (
    BATCH_TAG,
    MAX_BATCH_BYTES,
    MAX_BATCH_PARTS,
    batch_size,
    encode_batch,
    is_batch,
    split_batch,
)
from .envelope import (
    DEFAULT_CHUNK_SIZE,
    MAX_PARTS,
    VERSION,
    Part,
    encode,
    is_envelope,
    new_id,
    parse,
)
from .errors import BufferFullError, ExpiredError, PartCountError, TooLargeError, WireError

__all__ = [
    "BATCH_TAG",
    "DEFAULT_CHUNK_SIZE",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_PARTS",
    "MAX_PARTS",
    "VERSION",
    "Assembler",
    "AssemblerConfig",
    "BufferFullError",
    "ExpiredError",
    "Part",
    "PartCountError",
    "TooLargeError",
    "WireError",
    "batch_size",
    "encode",
    "encode_batch",
    "is_batch",
    "is_envelope",
    "new_id",
    "parse",
    "split_batch",
]

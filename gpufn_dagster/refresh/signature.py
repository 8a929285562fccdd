"""Per-row signatures: a 64-bit hash of the Function version and the row's input values.

A row is current when its stored signature equals the one computed from its inputs now, so a
changed input or a new Function version make it stale, row by row, without keeping old inputs.

The hash must tell apart any two distinct Arrow values a column can hold, so it follows Arrow's
structure instead of a text rendering: a NULL is not an empty string, a 0 or an empty list;
a list hashes its length and each element with its position; a struct each field in order;
strings and binaries every byte with its position and their length; nested values recursively.
Fixed-width values (numbers, booleans, dates, times, timestamps, durations, decimals,
fixed-size binaries) are hashed from their bytes with numpy (splitmix64's finalizer, vectorized);
top-level strings and binaries are digested by Lance while it scans (blake3), which is faster
for long text. 64 bits make an undetected change as likely as 1 in 1.8e19 per changed row.

The stored signature 0 is reserved: it marks a row whose last computation failed, so such a
row is stale for every version and inputs (see `FAILED`).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from ..errors import UnsupportedInputType
from ..function_spec.functions import Function

SIG_TYPE = pa.uint64()
# Stored for a row that failed under on_error="skip": no computed signature equals it, so the row
# is retried by the next refresh, and checks can count failed rows still without a value.
FAILED = 0
# Bumped when the hashing scheme changes, so that signatures of two schemes never compare equal.
_SCHEME = "gpufn-signature-2"
_NULL = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
# Salts keep the parts of a value apart: a list's length is not one of its elements, and so on.
_S_VALUE, _S_POSITION, _S_LENGTH, _S_STRUCT, _S_BYTE = (np.uint64(s) for s in (
    0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89, 0x452821E638D01377))
_DIGESTED = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit affects every output bit (a bijection on uint64).

    Stored signatures depend on these exact values (a change would recompute every row):

    >>> [int(v) for v in _mix(np.array([0, 1, 12345], dtype=np.uint64))]
    [0, 6238072747940578789, 17540659726606785873]
    """
    return _mix_in_place(h.copy(), np.empty_like(h))


def _mix_in_place(h: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """`_mix` into `h` itself, with `scratch` (as long as `h`) for the shifts: the row hash of a
    batch mixes once per input, and fresh temporaries per step cost more than the arithmetic
    (each is new memory, so page faults)."""
    for shift, factor in ((30, _M1), (27, _M2), (31, None)):
        np.right_shift(h, np.uint64(shift), out=scratch)
        np.bitwise_xor(h, scratch, out=h)
        if factor is not None:
            np.multiply(h, factor, out=h)
    return h


def unsupported_reason(data_type: pa.DataType) -> str | None:
    """Why an Arrow type cannot be an input, or None when it can (every type Lance stores can).

    >>> unsupported_reason(pa.list_(pa.struct([("a", pa.date32()), ("b", pa.decimal128(10, 2))])))
    >>> unsupported_reason(pa.month_day_nano_interval())
    'month_day_nano_interval is not supported'
    """
    if isinstance(data_type, pa.ExtensionType):
        return unsupported_reason(data_type.storage_type)
    if pa.types.is_dictionary(data_type):
        return unsupported_reason(data_type.value_type)
    if (pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)
            or pa.types.is_map(data_type)):
        return unsupported_reason(data_type.value_type if not pa.types.is_map(data_type)
                                  else pa.struct([data_type.key_field, data_type.item_field]))
    if pa.types.is_struct(data_type):
        return next(filter(None, (unsupported_reason(f.type) for f in data_type)), None)
    if (pa.types.is_null(data_type) or pa.types.is_boolean(data_type) or _byte_width(data_type)
            or any(test(data_type) for test in _DIGESTED) or pa.types.is_string_view(data_type)
            or pa.types.is_binary_view(data_type)):
        return None
    return f"{data_type} is not supported"


def _byte_width(data_type: pa.DataType) -> int:
    """Bytes per value of a fixed-width primitive type (0 for others, and for booleans)."""
    if pa.types.is_fixed_size_binary(data_type) or pa.types.is_decimal(data_type):
        return data_type.byte_width
    if (pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_date(data_type)
            or pa.types.is_time(data_type) or pa.types.is_timestamp(data_type) or pa.types.is_duration(data_type)):
        return data_type.bit_width // 8
    return 0


def _with_nulls(array: pa.Array, h: np.ndarray) -> np.ndarray:
    if array.null_count:
        h = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL, h)
    return h


def _fixed_hashes(array: pa.Array, width: int) -> np.ndarray:
    """The raw bytes of each value, read as little-endian 64-bit words and mixed in order."""
    n = len(array)
    raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)[array.offset * width:(array.offset + n) * width]
    if width in (1, 2, 4, 8):
        words = raw.view(f"<u{width}").astype(np.uint64).reshape(n, 1)
    else:
        words = _words(raw, n, width)
    h = np.full(n, _S_VALUE ^ np.uint64(width), dtype=np.uint64)
    for column in words.T:
        h = _mix(h ^ column)
    return h


def _segment_sums(terms: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum (mod 2**64) of terms[start:start+length] per segment; segments are contiguous in order."""
    sums = np.zeros(len(lengths), dtype=np.uint64)
    nonempty = lengths > 0
    if nonempty.any():
        sums[nonempty] = np.add.reduceat(terms, starts[nonempty])
    return sums


def _positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each element's index within its segment."""
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def _bytes_hashes(array: pa.Array) -> np.ndarray:
    """Every byte with its position, and the length, of each string or binary value."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset:array.offset + len(array) + 1]
    offsets = offsets.astype(np.int64)
    buffer = array.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8)[offsets[0]:offsets[-1]] if buffer else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
    keys = (_positions(starts, lengths).astype(np.uint64) << np.uint64(8)) | data.astype(np.uint64)
    sums = _segment_sums(_mix(keys ^ _S_BYTE), starts, lengths)
    return _mix(sums ^ _mix(lengths.astype(np.uint64) ^ _S_LENGTH))


def _words(raw: np.ndarray, n: int, width: int) -> np.ndarray:
    """`n` rows of `width` bytes each, as little-endian 64-bit words (the last one zero-padded)."""
    if width % 8 == 0:
        return raw.reshape(n, width).view("<u8")
    padded = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = raw.reshape(n, width)
    return padded.view("<u8")


def _position_salts(count: int) -> np.ndarray:
    return _mix(np.arange(count, dtype=np.uint64) ^ _S_POSITION)


_CHUNK_WORDS = 1 << 17  # words hashed at once: small enough to stay in cache


def _fixed_size_list_hashes(array: pa.FixedSizeListArray, width: int) -> np.ndarray:
    """A fixed-size list of fixed-width values (an embedding) from its row's bytes in one block.

    Each row's values are contiguous, so the row is hashed as its 64-bit words, each with its
    position: one mix per 8 bytes instead of several per element. Elements that are NULL read as
    zero bytes, and a row holding any NULL also mixes in which elements are NULL -- decided by the
    row's own value only, so a value hashes the same whatever rows share its batch.
    """
    n, size = len(array), array.type.list_size
    child = array.values.slice(array.offset * size, n * size)
    length = _mix(np.array([size], dtype=np.uint64) ^ _S_LENGTH)
    if n == 0 or size == 0:
        return np.full(n, _mix(length)[0], dtype=np.uint64)
    raw = np.frombuffer(child.buffers()[1], dtype=np.uint8)[child.offset * width:(child.offset + n * size) * width]
    nulls = child.is_null().to_numpy(zero_copy_only=False).reshape(n, size) if child.null_count else None
    if nulls is not None:
        raw = np.where(np.repeat(nulls.ravel(), width), 0, raw).astype(np.uint8)
    row_bytes = size * width
    salts = _position_salts(-(-row_bytes // 8))
    h = np.empty(n, dtype=np.uint64)
    step = max(1, _CHUNK_WORDS // len(salts))
    for start in range(0, n, step):
        rows = min(step, n - start)
        words = _words(raw[start * row_bytes:(start + rows) * row_bytes], rows, row_bytes)
        h[start:start + rows] = _mix(_mix(words ^ salts).sum(axis=1, dtype=np.uint64) ^ length)
    if nulls is not None:
        with_nulls = nulls.any(axis=1)
        bits = np.packbits(nulls[with_nulls], axis=1, bitorder="little")
        null_words = _words(bits.ravel(), int(with_nulls.sum()), bits.shape[1])
        h[with_nulls] = _mix(h[with_nulls] ^ _mix(null_words ^ _position_salts(null_words.shape[1])).sum(
            axis=1, dtype=np.uint64))
    return h


def _list_hashes(child: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A list value from its elements' hashes (offsets from 0): each element with its position, and the length."""
    starts, lengths = offsets[:-1], np.diff(offsets)
    terms = _mix(child ^ _mix(_positions(starts, lengths).astype(np.uint64) ^ _S_POSITION))
    sums = _segment_sums(terms, starts, lengths)
    return _mix(sums ^ _mix(lengths.astype(np.uint64) ^ _S_LENGTH))


def value_hashes(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One 64-bit hash per value of any Arrow type Lance stores; distinct values, distinct hashes.

    >>> a = value_hashes(pa.array([["Hello, world"], ["Hello", " world"], ["p", None], ["p"], None, []]))
    >>> len(set(a.tolist()))
    6
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    data_type = array.type
    if isinstance(data_type, pa.ExtensionType):
        return value_hashes(array.storage)
    if pa.types.is_null(data_type):
        return np.full(len(array), _NULL, dtype=np.uint64)
    if pa.types.is_dictionary(data_type):
        values = value_hashes(array.dictionary)
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return _with_nulls(array, values[indices] if len(values) else np.zeros(len(array), dtype=np.uint64))
    if pa.types.is_boolean(data_type):
        bits = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
        return _with_nulls(array, _mix(bits ^ _S_VALUE))
    if width := _byte_width(data_type):
        return _with_nulls(array, _fixed_hashes(array, width))
    if pa.types.is_string_view(data_type) or pa.types.is_binary_view(data_type):
        return value_hashes(array.cast(pa.large_string() if pa.types.is_string_view(data_type) else pa.large_binary()))
    if any(test(data_type) for test in _DIGESTED):
        return _with_nulls(array, _bytes_hashes(array))
    if pa.types.is_fixed_size_list(data_type) and (width := _byte_width(data_type.value_type)):
        return _with_nulls(array, _fixed_size_list_hashes(array, width))
    if pa.types.is_fixed_size_list(data_type):
        size = data_type.list_size
        child = value_hashes(array.values.slice(array.offset * size, len(array) * size))
        return _with_nulls(array, _list_hashes(child, np.arange(len(array) + 1, dtype=np.int64) * size))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type):
        offsets = array.offsets.to_numpy().astype(np.int64)
        child = value_hashes(array.values.slice(offsets[0], offsets[-1] - offsets[0]))
        return _with_nulls(array, _list_hashes(child, offsets - offsets[0]))
    if pa.types.is_struct(data_type):
        h = np.full(len(array), _S_STRUCT ^ np.uint64(data_type.num_fields), dtype=np.uint64)
        for i in range(data_type.num_fields):
            h = _mix(h ^ value_hashes(array.field(i)))
        return _with_nulls(array, h)
    raise UnsupportedInputType(unsupported_reason(data_type) or f"{data_type} is not supported")


def digest_column(name: str) -> str:
    return f"__gpufn_digest_{name}"


def scan_expressions(function: Function, schema: pa.Schema) -> dict[str, str]:
    """Lance expressions to add to the scan: a blake3 digest of each top-level string/binary input."""
    return {digest_column(name): f"digest(`{name}`, 'blake3')" for name in function.inputs
            if any(test(schema.field(name).type) for test in _DIGESTED)}


def check_input_types(function: Function, schema: pa.Schema) -> None:
    """Refuse, before anything is computed, an input whose type cannot be signed."""
    for name in function.inputs:
        if name in schema.names and (reason := unsupported_reason(schema.field(name).type)):
            raise UnsupportedInputType(
                f"Function {function.name!r}: field 'inputs': column {name!r} of table {function.table!r} has "
                f"type {schema.field(name).type}, which cannot be an input ({reason}); select or cast it in a "
                "view, or compute from other columns")


def _digest_hashes(digests: pa.Array) -> np.ndarray:
    """First 8 bytes of each 32-byte blake3 digest, as uint64 (NULL inputs map to a constant)."""
    fixed = (digests.fill_null(b"\0" * 32) if digests.null_count else digests).cast(pa.binary(32))
    buffer = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    rows = buffer[fixed.offset * 32:(fixed.offset + len(fixed)) * 32].reshape(len(fixed), 32)
    return _with_nulls(digests, np.ascontiguousarray(rows[:, :8]).view(np.uint64).ravel())


def version_seed(function: Function) -> np.uint64:
    seed = hashlib.sha256(f"{_SCHEME}:{function.version}".encode()).digest()[:8]
    return np.uint64(int.from_bytes(seed, "little"))


def _row_part(array: pa.Array) -> np.ndarray:
    """One input's contribution to the row signature.

    A top-level value of up to 8 bytes enters as its raw bits (NULL as a constant, as everywhere):
    the row hash mixes it anyway, and that mix is a bijection, so no two values meet; everything
    else enters as `value_hashes`. Either way a value's part depends on that value alone.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    width = _byte_width(array.type)
    if width in (1, 2, 4, 8):
        raw = np.frombuffer(array.buffers()[1], dtype=f"<u{width}")[array.offset:array.offset + len(array)]
        return _with_nulls(array, raw.astype(np.uint64) if width < 8 else raw)
    return value_hashes(array)


def row_signatures(function: Function, batch: pa.RecordBatch) -> pa.Array:
    """The signature of every row of a scanned batch (inputs plus their digests); never `FAILED`."""
    h = np.full(batch.num_rows, version_seed(function), dtype=np.uint64)
    scratch = np.empty_like(h)
    for name in function.inputs:
        digest = digest_column(name)
        if digest in batch.schema.names:
            part = _digest_hashes(batch.column(digest))
        else:
            part = _row_part(batch.column(name))
        np.bitwise_xor(h, part, out=h)
        _mix_in_place(h, scratch)
    return pa.array(np.maximum(h, np.uint64(FAILED + 1), out=h), type=SIG_TYPE)

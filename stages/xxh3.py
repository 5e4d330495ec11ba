"""XXH3-64 (seed 0, the default secret) compiled with numba, over a byte range of a uint8 buffer.

Why: the filter hashed every line (boilerplate) and every distinct word (Gopher repetition) with
`xxhash.xxh3_64_intdigest`, one Python call per line or word: about a quarter of the filter's CPU on
the real corpus. The compiled loops now hash a line or word where they find it in the Arrow UTF-8
buffer. The values are those of the `xxhash` package (XXH3 of xxHash 0.8, the same stored hashes:
the tests compare every length class, 0 to over 1024 bytes), so line hashes in a scores cache or a
report stay valid.
"""
from __future__ import annotations

import numba as nb
import numpy as np

_U = nb.uint64

SECRET = np.array([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
], dtype=np.uint8)

P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3, P64_4, P64_5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                     0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
MX1, MX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25


@nb.njit(cache=True, nogil=True)
def _r64(b, i):
    return (_U(b[i]) | (_U(b[i + 1]) << _U(8)) | (_U(b[i + 2]) << _U(16)) | (_U(b[i + 3]) << _U(24))
            | (_U(b[i + 4]) << _U(32)) | (_U(b[i + 5]) << _U(40)) | (_U(b[i + 6]) << _U(48)) | (_U(b[i + 7]) << _U(56)))


@nb.njit(cache=True, nogil=True)
def _r32(b, i):
    return _U(b[i]) | (_U(b[i + 1]) << _U(8)) | (_U(b[i + 2]) << _U(16)) | (_U(b[i + 3]) << _U(24))


@nb.njit(cache=True, nogil=True)
def _fold(a, b):
    """The 128-bit product of a and b, its halves xored (XXH3_mul128_fold64, the portable form)."""
    m = _U(0xFFFFFFFF)
    lo_lo = (a & m) * (b & m)
    hi_lo = (a >> _U(32)) * (b & m)
    lo_hi = (a & m) * (b >> _U(32))
    hi_hi = (a >> _U(32)) * (b >> _U(32))
    cross = (lo_lo >> _U(32)) + (hi_lo & m) + lo_hi
    upper = (hi_lo >> _U(32)) + (cross >> _U(32)) + hi_hi
    lower = (cross << _U(32)) | (lo_lo & m)
    return lower ^ upper


@nb.njit(cache=True, nogil=True)
def _avalanche(h):
    h ^= h >> _U(37)
    h *= _U(MX1)
    return h ^ (h >> _U(32))


@nb.njit(cache=True, nogil=True)
def _xxh64_avalanche(h):
    h ^= h >> _U(33)
    h *= _U(P64_2)
    h ^= h >> _U(29)
    h *= _U(P64_3)
    return h ^ (h >> _U(32))


@nb.njit(cache=True, nogil=True)
def _rotl(x, r):
    return (x << _U(r)) | (x >> _U(64 - r))


@nb.njit(cache=True, nogil=True)
def _mix16(b, i, s, j):
    return _fold(_r64(b, i) ^ _r64(s, j), _r64(b, i + 8) ^ _r64(s, j + 8))


@nb.njit(cache=True, nogil=True)
def _acc512(acc, b, i, s, j):
    for k in range(8):
        v = _r64(b, i + 8 * k)
        key = v ^ _r64(s, j + 8 * k)
        acc[k ^ 1] += v
        acc[k] += (key & _U(0xFFFFFFFF)) * (key >> _U(32))


@nb.njit(cache=True, nogil=True)
def _long(b, start, n, s):
    acc = np.empty(8, dtype=np.uint64)
    acc[0], acc[1], acc[2], acc[3] = _U(P32_3), _U(P64_1), _U(P64_2), _U(P64_3)
    acc[4], acc[5], acc[6], acc[7] = _U(P64_4), _U(P32_2), _U(P64_5), _U(P32_1)
    stripes = (len(s) - 64) // 8
    block = 64 * stripes
    blocks = (n - 1) // block
    for k in range(blocks):
        for q in range(stripes):
            _acc512(acc, b, start + k * block + q * 64, s, q * 8)
        for q in range(8):  # scramble
            a = acc[q]
            a ^= a >> _U(47)
            a ^= _r64(s, len(s) - 64 + 8 * q)
            acc[q] = a * _U(P32_1)
    last = ((n - 1) - block * blocks) // 64
    for q in range(last):
        _acc512(acc, b, start + blocks * block + q * 64, s, q * 8)
    _acc512(acc, b, start + n - 64, s, len(s) - 64 - 7)
    h = _U(n) * _U(P64_1)
    for q in range(4):
        h += _fold(acc[2 * q] ^ _r64(s, 11 + 16 * q), acc[2 * q + 1] ^ _r64(s, 11 + 16 * q + 8))
    return _avalanche(h)


@nb.njit(cache=True, nogil=True)
def xxh3_64(b, start, end):
    """xxhash.xxh3_64_intdigest(bytes(b[start:end])) (seed 0) as uint64."""
    s = SECRET
    n = end - start
    if n <= 16:
        if n > 8:
            lo = _r64(b, start) ^ (_r64(s, 24) ^ _r64(s, 32))
            hi = _r64(b, end - 8) ^ (_r64(s, 40) ^ _r64(s, 48))
            acc = _U(n) + ((lo >> _U(56)) | ((lo >> _U(40)) & _U(0xFF00)) | ((lo >> _U(24)) & _U(0xFF0000))
                           | ((lo >> _U(8)) & _U(0xFF000000)) | ((lo << _U(8)) & _U(0xFF00000000))
                           | ((lo << _U(24)) & _U(0xFF0000000000)) | ((lo << _U(40)) & _U(0xFF000000000000))
                           | (lo << _U(56))) + hi + _fold(lo, hi)
            return _avalanche(acc)
        if n >= 4:
            x = (_r32(b, end - 4) + (_r32(b, start) << _U(32))) ^ (_r64(s, 8) ^ _r64(s, 16))
            x ^= _rotl(x, 49) ^ _rotl(x, 24)
            x *= _U(MX2)
            x ^= (x >> _U(35)) + _U(n)
            x *= _U(MX2)
            return x ^ (x >> _U(28))
        if n > 0:
            combined = ((_U(b[start]) << _U(16)) | (_U(b[start + (n >> 1)]) << _U(24)) | _U(b[end - 1])
                        | (_U(n) << _U(8)))
            return _xxh64_avalanche(combined ^ (_r32(s, 0) ^ _r32(s, 4)))
        return _xxh64_avalanche(_r64(s, 56) ^ _r64(s, 64))
    if n <= 128:
        acc = _U(n) * _U(P64_1)
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(b, start + 48, s, 96)
                    acc += _mix16(b, end - 64, s, 112)
                acc += _mix16(b, start + 32, s, 64)
                acc += _mix16(b, end - 48, s, 80)
            acc += _mix16(b, start + 16, s, 32)
            acc += _mix16(b, end - 32, s, 48)
        acc += _mix16(b, start, s, 0)
        acc += _mix16(b, end - 16, s, 16)
        return _avalanche(acc)
    if n <= 240:
        acc = _U(n) * _U(P64_1)
        for k in range(8):
            acc += _mix16(b, start + 16 * k, s, 16 * k)
        acc = _avalanche(acc)
        for k in range(8, n // 16):
            acc += _mix16(b, start + 16 * k, s, 16 * (k - 8) + 3)
        acc += _mix16(b, end - 16, s, 136 - 17)
        return _avalanche(acc)
    return _long(b, start, n, s)


@nb.njit(cache=True, nogil=True)
def hash_ranges(b: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """xxh3_64 of every byte range [starts[k], ends[k]) of `b` (tests and small callers)."""
    out = np.empty(len(starts), dtype=np.uint64)
    for k in range(len(starts)):
        out[k] = xxh3_64(b, starts[k], ends[k])
    return out

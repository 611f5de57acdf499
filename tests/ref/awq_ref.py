#!/usr/bin/env python3
"""awq_ref.py - an independent re-implementation (stdlib only) of salafw's
int8 RTN group quantizer and its pack-quantized layout (num/w8_layout.h),
for tests/test_quant.c's bit-exact comparison.

  awq_ref.py SEED ROWS COLS GROUP [bf16]

GROUP is 32, 64, 128 or 0 (channel). The matrix comes from the generator
shared with the C test (gen_matrix below; splitmix64, exact float32 values);
with "bf16" every value is first rounded to bf16, as model weights are.
Prints one line per row: "<packed> <scales>", the packed row as the
little-endian bytes of its I32 words (ceil(COLS/4) words) and the bf16 scale
bits, both in hex.

The rule (compressed-tensors' symmetric int8, scale divided as stored):
  scale = bf16_rne(max(amax / 127.5, float32 eps)), one bf16 ulp up when amax / scale > 127.5
  (so no weight is clamped by more than half a step); q = clamp(round_half_even(w / scale), -128, 127);
  byte = q + 128; element k of a row goes into word k // 4 at bit 8 * (k % 4).
Float32 arithmetic is emulated exactly: a float32 +, -, *, / computed in
double and rounded once to float32 is the correctly rounded float32 result.
"""
import struct
import sys

MASK64 = (1 << 64) - 1


def f32(x):
    return struct.unpack('<f', struct.pack('<f', x))[0]


def f32_bits(x):
    return struct.unpack('<I', struct.pack('<f', x))[0]


def bits_f32(u):
    return struct.unpack('<f', struct.pack('<I', u))[0]


def bf16_rne(x):
    """float32 value -> bf16 bits, round to nearest even (finite inputs)."""
    u = f32_bits(x)
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff


def bf16_value(h):
    return bits_f32(h << 16)


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def gen_matrix(seed, rows, cols, bf16):
    """Row 0 all zeros; row 1 exact rounding ties; row 2 a scale that needs its bf16 ulp bump; every 7th row x64; one x16
    outlier per row; the rest m * 2^-28 with m a 23-bit signed integer."""
    g = SplitMix64(seed)
    out = []
    for r in range(rows):
        row = []
        for k in range(cols):
            m = (g.next() >> 41) - (1 << 22)
            v = m * 2.0 ** -28
            if r % 7 == 6:
                v *= 64.0
            if k == r % cols:
                v *= 16.0
            if r == 0:
                v = 0.0
            if r == 1:
                v = (((k % 21) - 10) + 0.5) * 2.0 ** -10 if k else 127.5 * 2.0 ** -10
            if r == 2:  # amax / 127.5 rounds down in bf16: the scale needs its ulp bump
                v = 127.5 * 1.003125 * 2.0 ** -15 if k % 3 == 0 else ((k % 7) - 3) * 2.0 ** -17
            v = f32(v)
            if bf16:
                v = bf16_value(bf16_rne(v))
            row.append(v)
        out.append(row)
    return out


def round_half_even(x):
    return int(round(x))  # Python's round() on a float is exact half-to-even


def quant_row(row, group):
    cols = len(row)
    span = group if group > 0 else cols
    codes, scales = [], []
    for k0 in range(0, cols, span):
        grp = row[k0:k0 + span]
        amax = max(abs(v) for v in grp)
        s = f32(amax / 127.5)
        s = max(s, bits_f32(0x34000000))  # float32 eps = 2^-23
        h = bf16_rne(s)
        sd = bf16_value(h)
        if f32(amax / sd) > 127.5:  # rounded too low: one bf16 ulp up
            h += 1
            sd = bf16_value(h)
        scales.append(h)
        for v in grp:
            q = round_half_even(f32(v / sd))
            q = min(max(q, -128), 127)
            codes.append(q + 128)
    return codes, scales


def pack_row(codes):
    words = []
    for w0 in range(0, len(codes), 4):
        word = 0
        for lane, b in enumerate(codes[w0:w0 + 4]):
            word |= b << (8 * lane)
        words.append(word)
    return b''.join(struct.pack('<I', w) for w in words)


def main():
    if len(sys.argv) < 5:
        sys.exit('usage: awq_ref.py SEED ROWS COLS GROUP [bf16]')
    seed, rows, cols, group = (int(a) for a in sys.argv[1:5])
    bf16 = len(sys.argv) > 5 and sys.argv[5] == 'bf16'
    for row in gen_matrix(seed, rows, cols, bf16):
        codes, scales = quant_row(row, group)
        sys.stdout.write(pack_row(codes).hex() + ' ' + ''.join('%04x' % h for h in scales) + '\n')


if __name__ == '__main__':
    main()

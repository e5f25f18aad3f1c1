"""Throughput of the envelope codec against plain base64, measured in one run.

Usage: ``python bench/wire_bench.py [--quick]``

For message sizes 200 B, 16 KiB, 1 MiB and 12 MiB it prints encode MB/s and
parse+reassemble MB/s, each with its ratio to ``base64.b64encode`` /
``binascii.a2b_base64`` of the same payload measured in the same run; then
the ``is_envelope`` rate on plain chat lines with its ratio to
``str.startswith``; then 200 B encode+parse round trips per second.
Every figure is the best of many short timed repetitions (noise only ever
makes a run slower), taken with this thread's CPU time unless ``--wall`` is
given, and each codec timing alternates with its baseline's. Each figure
with a target is marked PASS or MISS; MB = 10**6 bytes.
The exit status is 0 either way: this is a report, not a test.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brmcp import wire

SID = "0123456789abcdef"
EXP = 1783000600
NOW = float(EXP - 60)
KIB = 1024
MIB = 1024 * KIB
SIZES = [("200 B", 200), ("16 KiB", 16 * KIB), ("1 MiB", MIB), ("12 MiB", 12 * MIB)]

ENCODE_TARGET = 0.7
PARSE_TARGET = 0.5
IS_ENVELOPE_TARGET = 0.3
ROUND_TRIP_TARGET = 150_000


# The clock: this thread's CPU time by default, so that other processes on a
# busy machine do not count against either side of a ratio; --wall switches
# to time.perf_counter.
_clock: Callable[[], float] = time.thread_time


def best_of(*funcs: Callable[[], object], repeat: int, number: int) -> list[float]:
    """Seconds per call of each of ``funcs``: the smallest of ``repeat``
    timings of ``number`` back-to-back calls. The functions take turns within
    each repetition, so a codec and its baseline see the same machine load."""
    best = [float("inf")] * len(funcs)
    for _ in range(repeat):
        for index, func in enumerate(funcs):
            start = _clock()
            for _ in range(number):
                func()
            best[index] = min(best[index], (_clock() - start) / number)
    return best


def calls_for(size: int, quick: bool) -> tuple[int, int]:
    """(repeat, number): short timings (about 256 KiB of payload each), many
    of them, so the best one is likely to be undisturbed."""
    number = max(1, (256 * KIB) // size)
    return (6 if quick else 25), number


def verdict(value: float, target: float) -> str:
    return "PASS" if value >= target else "MISS"


def measure_size(payload: bytes, quick: bool) -> tuple[float, float, float, float, int]:
    """Seconds per call of (encode, b64encode, parse+reassemble, a2b_base64)
    for one message, and its part count."""
    repeat, number = calls_for(len(payload), quick)
    encode_s, b64enc_s = best_of(
        lambda: wire.encode(payload, sid=SID, exp=EXP),
        lambda: base64.b64encode(payload),
        repeat=repeat,
        number=number,
    )

    parts = wire.encode(payload, sid=SID, exp=EXP)
    encoded = base64.b64encode(payload)

    def parse_and_reassemble() -> bytes | None:
        assembler = wire.Assembler()
        parse = wire.parse
        add = assembler.add
        out = None
        for text in parts:
            part = parse(text)
            assert part is not None
            out = add("peer", part, NOW)
        return out

    assert parse_and_reassemble() == payload
    parse_s, a2b_s = best_of(
        parse_and_reassemble, lambda: binascii.a2b_base64(encoded), repeat=repeat, number=number
    )
    return encode_s, b64enc_s, parse_s, a2b_s, len(parts)


def bench_sizes(quick: bool) -> list[bool]:
    results: list[bool] = []
    rng = random.Random(2)
    print(
        f"{'size':>7} | {'encode MB/s':>11} {'b64enc MB/s':>11} {'ratio':>6} {'':4} | "
        f"{'parse+asm MB/s':>14} {'a2b MB/s':>9} {'ratio':>6} {'':4}"
    )
    for label, size in SIZES:
        encode_s, b64enc_s, parse_s, a2b_s, count = measure_size(rng.randbytes(size), quick)
        enc_ratio = b64enc_s / encode_s
        parse_ratio = a2b_s / parse_s
        targeted = size >= MIB
        enc_mark = verdict(enc_ratio, ENCODE_TARGET) if targeted else ""
        parse_mark = verdict(parse_ratio, PARSE_TARGET) if targeted else ""
        if targeted:
            results += [enc_ratio >= ENCODE_TARGET, parse_ratio >= PARSE_TARGET]
        print(
            f"{label:>7} | {size / encode_s / 1e6:11.1f} {size / b64enc_s / 1e6:11.1f} {enc_ratio:6.2f} "
            f"{enc_mark:4} | {size / parse_s / 1e6:14.1f} {size / a2b_s / 1e6:9.1f} {parse_ratio:6.2f} "
            f"{parse_mark:4}  ({count} part{'s' if count > 1 else ''})"
        )
    print(
        f"targets: 1 MiB and 12 MiB encode >= {ENCODE_TARGET}x b64encode, "
        f"parse+reassemble >= {PARSE_TARGET}x a2b_base64"
    )
    return results


def chat_lines(count: int) -> list[str]:
    rng = random.Random(7)
    words = [
        *("hey", "bot", "how", "are", "you", "today", "price", "fortune", "tip", "thanks"),
        *("lol", "ok", "the", "a", "is", "it", "what", "when", "why"),
    ]
    lines = []
    for _ in range(count):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 14)))
        style = rng.randint(0, 5)
        if style == 0:
            text = "> **nick:** " + text
        elif style == 1:
            text = text.capitalize() + "?"
        elif style == 2:
            text = "--embed[type=image/png,data=QUJD]--" if rng.random() < 0.2 else text + " :)"
        lines.append(text)
    return lines


def bench_is_envelope() -> bool:
    lines = chat_lines(20_000)
    tag = "--mcp["
    is_envelope = wire.is_envelope

    def run_is_envelope() -> None:
        for line in lines:
            is_envelope(line)

    def run_startswith() -> None:
        for line in lines:
            line.startswith(tag)

    assert not any(is_envelope(line) for line in lines)
    repeat = 25  # cheap: the same in --quick runs
    ie_s, sw_s = best_of(run_is_envelope, run_startswith, repeat=repeat, number=1)
    ratio = sw_s / ie_s
    print(
        f"is_envelope on chat: {len(lines) / ie_s:,.0f} lines/s; "
        f"str.startswith: {len(lines) / sw_s:,.0f} lines/s; "
        f"ratio {ratio:.2f} {verdict(ratio, IS_ENVELOPE_TARGET)} (target >= {IS_ENVELOPE_TARGET})"
    )
    return ratio >= IS_ENVELOPE_TARGET


def bench_round_trips() -> bool:
    payload = os.urandom(200)
    encode = wire.encode
    parse = wire.parse

    def round_trip() -> None:
        # A fresh mid per message, as the router sends it.
        part = parse(encode(payload, sid=SID, exp=EXP)[0])
        assert part is not None

    (seconds,) = best_of(round_trip, repeat=60, number=500)  # cheap: the same in --quick runs
    rate = 1 / seconds
    print(
        f"200 B encode+parse round trips: {rate:,.0f}/s "
        f"{verdict(rate, ROUND_TRIP_TARGET)} (target >= {ROUND_TRIP_TARGET:,}/s)"
    )
    return rate >= ROUND_TRIP_TARGET


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--wall", action="store_true", help="time with the wall clock instead of CPU time")
    args = parser.parse_args(argv)
    global _clock
    _clock = time.perf_counter if args.wall else time.thread_time
    print(
        f"brmcp wire benchmark, Python {sys.version.split()[0]}, {'quick' if args.quick else 'full'} run, "
        f"{'wall clock' if args.wall else 'thread CPU time'}"
    )
    results = bench_sizes(args.quick)
    results.append(bench_is_envelope())
    results.append(bench_round_trips())
    missed = results.count(False)
    print(f"{len(results) - missed}/{len(results)} targets met" + (f", {missed} MISS" if missed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

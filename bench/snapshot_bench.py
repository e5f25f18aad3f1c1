"""Directory snapshots: the index in signed pages against the single message.

Usage: ``python bench/snapshot_bench.py [--quick] [--seed N]``

For 100k synthetic listings (the catalogs of bench/directory_bench.py: 2 to
8 tools each) it builds the manifest and pages (brmcp/directory/model/_pages.py,
1 MiB pages) and verifies them as a consumer does (the manifest, then each
page's signature and SHA-256, then the listings decoded); for 10k it builds
and verifies the single-message ``get_snapshot`` answer
(brmcp/directory/model/_snapshot.py). Each time is the best of three runs, in
seconds, also with Python's cyclic collector paused (keeping 100k decoded
listings alive makes its passes a large share of the paged verify).
Sizes are the signed JSON a tool answer carries once (base64
payload plus signature); on the wire a tool answer carries it twice
(structured content and text).

Targets: every page's tool answer under the 16 MiB message bound (WIRE.md
§Reassembly bounds) with room to spare (under 4 MiB), and the 100k paged
verify within 15x the 10k single-message verify, both with the collector
paused (linear in the listings: 10x, plus the per-page hashing). ``--quick`` measures 20k and 2k. The exit
status is 0 either way: this is a report, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.directory_bench import synth_listings
from brmcp.directory.model import PAGE_MAX_BYTES, Signer, SnapshotMirror, build_generation, verify_snapshot
from brmcp.directory.tools import snapshot_listing

T = TypeVar("T")
NOW = 1_790_000_000
MESSAGE_BOUND = 16 << 20
PAGE_ANSWER_TARGET = 4 << 20
VERIFY_RATIO_TARGET = 15.0
_MIB = float(1 << 20)


def best(func: Callable[[], T], repeat: int = 3) -> tuple[T, float]:
    """``func()``'s result and its best wall time in seconds over ``repeat`` runs."""
    times: list[float] = []
    result: Any = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return result, min(times)


def size(signed: dict[str, str]) -> int:
    return len(json.dumps(signed, separators=(",", ":")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20k paged, 2k single (a smoke run)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    paged_count, single_count = (20_000, 2_000) if args.quick else (100_000, 10_000)
    signer = Signer(Ed25519PrivateKey.generate())
    pub = signer.public_hex

    listings = [snapshot_listing(item) for item in synth_listings(paged_count, args.seed)]
    generation, build_s = best(lambda: build_generation(signer, listings, NOW), repeat=1)
    mirror = SnapshotMirror(pub)
    _, verify_s = best(lambda: mirror.load(generation.manifest, generation.pages))
    gc.disable()
    try:
        _, verify_nogc_s = best(lambda: mirror.load(generation.manifest, generation.pages))
    finally:
        gc.enable()
    if len(mirror.listings) != paged_count:
        raise SystemExit(f"the pages verified to {len(mirror.listings)} listings, not {paged_count}")
    page_sizes = [size(page) for page in generation.pages]
    manifest_size = size(generation.manifest)
    total = manifest_size + sum(page_sizes)

    single = listings[:single_count]
    signed, single_build_s = best(lambda: signer.build_snapshot(single, NOW), repeat=1)
    snapshot, single_verify_s = best(lambda: verify_snapshot(signed, pub))
    gc.disable()
    try:
        _, single_nogc_s = best(lambda: verify_snapshot(signed, pub))
    finally:
        gc.enable()
    if len(snapshot.listings) != single_count:
        raise SystemExit("the single-message snapshot did not verify to every listing")
    whole, _ = best(lambda: signer.build_snapshot(listings, NOW), repeat=1)

    print(f"paged snapshot of {paged_count:,} listings ({PAGE_MAX_BYTES // 1024} KiB pages)")
    print(f"  manifest      {manifest_size / 1024:8.1f} KiB, {len(generation.pages)} pages")
    largest = max(page_sizes, default=0)
    print(
        f"  pages         {sum(page_sizes) / _MIB:8.1f} MiB signed (largest page answer "
        f"{largest / _MIB:.2f} MiB once, {2 * largest / _MIB:.2f} MiB on the wire)"
    )
    print(f"  total         {total / _MIB:8.1f} MiB signed")
    print(f"  build         {build_s:8.2f} s (split, hash, sign)")
    print(f"  verify        {verify_s:8.2f} s (manifest + every page: signature, sha256, decode)")
    print(f"  verify, no gc {verify_nogc_s:8.2f} s (the same with the cyclic collector paused)")
    print(f"single-message snapshot of {single_count:,} listings")
    print(f"  size          {size(signed) / _MIB:8.1f} MiB signed")
    print(f"  build         {single_build_s:8.2f} s")
    print(f"  verify        {single_verify_s:8.2f} s")
    print(f"  verify, no gc {single_nogc_s:8.2f} s")
    print(
        f"the single message of all {paged_count:,} would be {size(whole) / _MIB:.1f} MiB signed, "
        f"{2 * size(whole) / _MIB:.1f} MiB as a tool answer (bound {MESSAGE_BOUND / _MIB:.0f} MiB)"
    )
    print()
    ratio = verify_nogc_s / single_nogc_s if single_nogc_s else float("inf")
    checks = [
        (
            f"largest page answer on the wire {2 * largest / _MIB:.2f} MiB "
            f"< {PAGE_ANSWER_TARGET / _MIB:.0f} MiB",
            2 * largest < PAGE_ANSWER_TARGET,
        ),
        (
            f"paged verify / single verify (no gc) = {ratio:.1f}x <= {VERIFY_RATIO_TARGET:.0f}x",
            ratio <= VERIFY_RATIO_TARGET,
        ),
    ]
    for label, met in checks:
        print(("ok    " if met else "MISS  ") + label)
    missed = sum(1 for _, met in checks if not met)
    print(f"{len(checks) - missed}/{len(checks)} targets met" + (f", {missed} MISS" if missed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

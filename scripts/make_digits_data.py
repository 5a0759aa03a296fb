"""Write data/digits_copy.jsonl: the dataset of graphs/grpo_dataset.yaml (prompts from a file).

400 rows ``{"id": ..., "number": "4071", "answer": "4071"}``: a number of 3 or 4 digits the model must copy
back (the embedded ``tiny`` model knows the format ``copy 4071: 4071``). Deterministic: the same file every
time (``python scripts/make_digits_data.py`` rewrites it; a test checks it matches).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROWS = 400


def rows(n: int = ROWS, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    seen: set[str] = set()
    out = []
    while len(out) < n:
        digits = rng.randint(3, 4)
        number = str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))
        if number not in seen:
            seen.add(number)
            out.append({"id": f"copy-{len(out):04d}", "number": number, "answer": number})
    return out


def text(n: int = ROWS, seed: int = 0) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows(n, seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "digits_copy.jsonl"))
    args = ap.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text())
    print(f"wrote {ROWS} rows to {args.out}")


if __name__ == "__main__":
    main()

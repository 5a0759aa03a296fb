"""Write a folder of pictures and a JSONL of questions about them: the shape of a user's own image data.

    python scripts/make_picture_data.py data/shapes           # 400 training rows, 64 held out
    omnigraph run graphs/vlm_one_step_off.yaml \\
        'task={source: data/shapes, image: image, prompt: question, answer: answer, split: train, eval_split: test}'

The folder gets ``images/*.png`` and two splits, ``train.jsonl`` and ``test.jsonl`` (a folder of data files is
read one split per file), each row ``{"id": ..., "image": "images/0007.png", "question": "colour:",
"answer": "red"}``: the picture's path is relative to the folder. The pictures are the ``shapes`` task's
(coloured squares; the held-out layouts only in ``test``). Deterministic: the same files every time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodes.tasks.shapes import IMAGE_TOKEN, Shapes  # noqa: E402


def write(out: Path, train: int = 400, test: int = 64, seed: int = 0) -> Path:
    task = Shapes(prompts=train, seed=seed, eval_prompts=test)
    (out / "images").mkdir(parents=True, exist_ok=True)
    for split, prompts in (("train", task.batch(0)), ("test", task.eval_set())):
        rows = []
        for i, p in enumerate(prompts):
            name = f"images/{split}-{i:04d}.png"
            (out / name).write_bytes(p.images[0])
            rows.append({"id": f"{split}-{i:04d}", "image": name, "question": p.text.replace(IMAGE_TOKEN, ""),
                         "answer": p.meta["target"]})
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the folder to write")
    ap.add_argument("--train", type=int, default=400, help="training rows")
    ap.add_argument("--test", type=int, default=64, help="held-out rows")
    args = ap.parse_args()
    write(args.out, args.train, args.test)
    print(f"wrote {args.train} + {args.test} rows and their pictures to {args.out}")


if __name__ == "__main__":
    main()

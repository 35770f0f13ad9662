"""Build a text corpus from the Python standard library found on this machine (no download), for
jobs/gpt_text.py:

    python scripts/build_corpus.py --out data/stdlib.jsonl [--tokenizer data/tokenizer.json]

Each row is one docstring or block of source comments: {"id", "module", "kind", "text"}, in a deterministic
order (modules sorted by path). With ``--tokenizer``, a byte-level BPE tokenizer (Hugging Face
``tokenizers``, a few seconds) is trained on the corpus and saved next to it: the job's preprocessing loads
it on the cluster's CPUs.
"""
from __future__ import annotations

import argparse
import ast
import json
import sysconfig
import time
from pathlib import Path

SKIP = ("test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__", "turtledemo", "ensurepip")


def modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts) & set(SKIP))


def docstrings(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 40:
                out.append(doc)
    return out


def comment_blocks(source: str) -> list[str]:
    """Runs of consecutive ``#`` comment lines, joined (at least 40 characters)."""
    blocks, current = [], []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            current.append(stripped.lstrip("#").strip())
            continue
        if current:
            blocks.append(" ".join(current))
            current = []
    if current:
        blocks.append(" ".join(current))
    return [b for b in blocks if len(b) >= 40]


def rows(root: Path):
    for path in modules(root):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for doc in docstrings(tree):
            yield {"module": module, "kind": "docstring", "text": doc}
        for block in comment_blocks(source):
            yield {"module": module, "kind": "comment", "text": block}


def train_tokenizer(corpus: Path, out: Path, vocab: int) -> None:
    from tokenizers import ByteLevelBPETokenizer

    def texts():
        with corpus.open() as f:
            for line in f:
                yield json.loads(line)["text"]

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(texts(), vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  show_progress=False)
    tokenizer.save(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/stdlib.jsonl")
    parser.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"], help="where the standard library is")
    parser.add_argument("--tokenizer", default="", help="also train a byte-level BPE tokenizer and save it here")
    parser.add_argument("--vocab", type=int, default=2048, help="the tokenizer's vocabulary size")
    args = parser.parse_args()
    started = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = chars = 0
    with out.open("w") as f:
        for n, row in enumerate(rows(Path(args.stdlib)), 1):
            chars += len(row["text"])
            f.write(json.dumps({"id": n - 1, **row}) + "\n")
    print(f"{out}: {n} rows, {chars / 1e6:.1f} M characters from {args.stdlib} "
          f"({time.perf_counter() - started:.1f} s)")
    if args.tokenizer:
        started = time.perf_counter()
        train_tokenizer(out, Path(args.tokenizer), args.vocab)
        print(f"{args.tokenizer}: byte-level BPE, {args.vocab} tokens ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

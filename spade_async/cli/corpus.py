"""``spade corpus sample PATH -n N [--json] [--seed S]``: look at grounding documents."""

from __future__ import annotations

import argparse
import sys

import msgspec

from spade_async.corpus import CorpusConfig, open_corpus
from spade_async.errors import UsageError


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="spade corpus", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="draw documents uniformly at random")
    s.add_argument("path", help="corpus: JSONL, parquet, text dir, saved dataset, or 'embedded'")
    s.add_argument("-n", type=int, default=1, help="documents to draw (default 1)")
    s.add_argument("--seed", type=int, default=None, help="seed for a reproducible draw")
    s.add_argument("--max-words", type=int, default=6000, help="truncate after this many words")
    s.add_argument("--json", action="store_true", help="print a JSON array of documents")
    return p


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one ``UsageError`` line (the CLI exits 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.n < 1:
        raise UsageError(f"-n {args.n}: ask for at least 1 document")
    from spade_async.config_bounds import check_flag  # the recipe's ranges, the same line

    check_flag("--seed", "seed", args.seed)  # numpy refuses a negative seed with a traceback
    check_flag("--max-words", "corpus.max_words", args.max_words)
    cfg = CorpusConfig(path=args.path, max_words=args.max_words)
    with open_corpus(cfg) as corpus:
        if corpus.warning:
            print(corpus.warning, file=sys.stderr)
        docs = corpus.sample(args.n, seed=args.seed)
        if args.json:
            print(msgspec.json.encode(docs).decode())
            return 0
        print(f"# {corpus.kind}: {len(corpus)} documents", file=sys.stderr)
        for doc in docs:
            cut = ", truncated" if doc.truncated else ""
            print(f"=== {doc.id} ({doc.words} words{cut}) ===\n{doc.text}\n")
    return 0

"""Coverage-guided fuzzing of one file reader with atheris (libFuzzer), from the valid seed file:

    python -m tests.fuzz.atheris_readers cache|safetensors|gguf|pte -runs=10000

Only the reader's documented error may escape; anything else is reported by libFuzzer as a crash
(with the input saved), and -timeout catches hangs. ``make fuzz`` runs it for every reader when
atheris installs."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["vkgraph"]):
    from .seeds import READERS


def main() -> None:
    name, argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
    build, suffix, read = READERS[name]
    work = Path(tempfile.mkdtemp(prefix=f"vkgraph-atheris-{name}-"))
    corpus = work / "corpus"
    corpus.mkdir()
    (corpus / f"seed{suffix}").write_bytes(build(work))
    path = work / f"input{suffix}"

    def one_input(data: bytes) -> None:
        path.write_bytes(data)
        read(path, len(data))

    atheris.Setup([*argv, "-timeout=10", "-rss_limit_mb=4096", str(corpus)], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

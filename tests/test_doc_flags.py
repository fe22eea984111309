"""Every `--flag` that README.md and docs/*.md name is an option of the program it is given
to: the build CLI (ours and Beam's pipeline options), the reader's CLI, the tools, or a
benchmark script. A renamed or removed option then fails here instead of in a user's shell.

Commands of other programs (gcloud, docker, pip, ...) and hyphenated flags (theirs: ours
and Beam's are spelt with underscores) are not checked; nor are flags quoted inside an
`error: ...` message, which name a wrong flag on purpose.
"""

import contextlib
import io
import re

import pytest

from beam_pipeline.launcher import options
from tests.helpers import REPO

DOCS = [REPO / "README.md", REPO / "benchmarks" / "README.md",
        *sorted((REPO / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)(?![\w-])")
FOREIGN = ("gcloud", "gsutil", "docker", "pip", "curl", "pytest", "git", "apt", "kubectl")
TOOLS = {  # command-line spelling -> module whose main(["--help"]) lists its options
    "beam_pipeline.tools.verify": "beam_pipeline.tools.verify",
    "image-tfrecords-verify": "beam_pipeline.tools.verify",
    "beam_pipeline.tools.inspect_dataset": "beam_pipeline.tools.inspect_dataset",
    "image-tfrecords-inspect": "beam_pipeline.tools.inspect_dataset",
    "beam_pipeline.tools.sample_data": "beam_pipeline.tools.sample_data",
    "beam_pipeline.tools.tag": "beam_pipeline.tools.tag",
    "beam_pipeline.tools.materialize": "beam_pipeline.tools.materialize",
    "readers": "readers.__main__",
}
BENCHMARK = re.compile(r"\b((?:bench_|baseline_|codec_)\w+\.py)")
BUILD = re.compile(r"(python -m beam_pipeline|image-tfrecords|run_local\.sh)$")


def _help_options(module):
    """The option strings a tool's --help lists (none for a tool without a main())."""
    import importlib

    main = getattr(importlib.import_module(module), "main", None)
    if main is None:
        return set()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_]*)", out.getvalue()))


@pytest.fixture(scope="module")
def programs():
    build = {s for a in options.known_options_parser()._actions for s in a.option_strings}
    build |= {"--help"}
    known = {"build": build}
    for module in set(TOOLS.values()):
        known[module] = _help_options(module)
    known["any"] = set().union(*known.values())  # a flag named outside a command
    return known


def _program(command):
    """Which program a command line runs: a key of `programs`, a benchmark path, or None
    (another program's command: not ours to check)."""
    words = command.split()
    for i, word in enumerate(words):
        word = word.rsplit("/", 1)[-1]
        if word in FOREIGN or (word == "-m" and i + 1 < len(words) and words[i + 1] in FOREIGN):
            return None
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module == "beam_pipeline":
                return "build"
            return TOOLS.get(module)
        if BUILD.search(word):
            return "build"
        if word in TOOLS and not word.startswith(("beam_pipeline", "readers")):
            return TOOLS[word]
        if word.endswith(".py") and word.startswith(("bench_", "baseline_", "codec_")):
            return f"benchmarks/{word}"
        if word.endswith(".py") and (REPO / "docker" / word).is_file():  # the image scripts
            return f"docker/{word}"
    return "any"


def _commands(text, context=""):
    """(line number, text, benchmarks named nearby) of each command line in a code block,
    and of each backticked span and bare flag of a prose paragraph."""
    found, in_code, pending, paragraph, heading = [], False, "", [], [""]

    def prose():
        if paragraph:
            number, joined = paragraph[0][0], " ".join(line for _, line in paragraph)
            near = set(BENCHMARK.findall(" ".join((joined, heading[0], context))))
            found.extend((number, span, near)
                         for span in re.findall(r"`([^`]*--[^`]*)`", joined))
            bare = re.sub(r"`[^`]*`", " ", joined)
            found.extend((number, f"--{f}", near) for f in FLAG.findall(bare))
            paragraph.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            prose()
            in_code, pending = not in_code, ""
        elif in_code:
            pending += line.split(" #", 1)[0]
            if pending.rstrip().endswith("\\"):
                pending = pending.rstrip()[:-1] + " "
                continue
            found.extend((number, part.strip(), set())
                         for part in re.split(r"&&|\|\||;|\|", pending))
            pending = ""
        elif line.startswith("#"):
            prose()
            heading[0] = line
        elif line.strip():
            paragraph.append((number, line))
        else:
            prose()
    prose()
    return found


def _unknown(text, programs, context=""):
    """(line, flag, program) of each flag the text names that its program lacks; `context`
    names benchmarks every paragraph may be about."""
    bad = []
    for number, command, near in _commands(text, context):
        if command.startswith("error:"):
            continue
        program = _program(command)
        if program is None:
            continue
        flags = {f"--{f}" for f in FLAG.findall(command)}
        if program.startswith(("benchmarks/", "docker/")):
            allowed = _benchmark_flags(program)
        else:  # a paragraph about a benchmark may name its flags
            allowed = programs[program].union(*(_benchmark_flags(f"benchmarks/{b}")
                                                for b in near))
        bad += [(number, f, program) for f in sorted(flags - allowed)]
    return bad


def _benchmark_flags(path):
    """The flags a benchmark (or image) script declares (string literals in its source)."""
    return set(re.findall(r"[\"'](--[a-z][a-z0-9_]*)[\"']", (REPO / path).read_text()))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_a_doc_names_exists(doc, programs):
    # benchmarks/README.md is about every benchmark
    context = (" ".join(p.name for p in (REPO / "benchmarks").glob("*.py"))
               if doc.parent.name == "benchmarks" else "")
    bad = _unknown(doc.read_text(), programs, context)
    assert not bad, "\n".join(f"{doc.name}:{n}: {flag} is not an option of {program}"
                              for n, flag, program in bad)


def test_the_check_catches_a_flag_that_does_not_exist(programs):
    text = ("Use `--num_shards` or `--no_write_index`.\n\n```bash\n"
            "python -m beam_pipeline --input x \\\n    --sharding 4\n"
            "python -m readers /tmp/ds --split train --out x\n"
            "gcloud dataflow flex-template run --parameters a=b\n```\n"
            "`error: unknown option --num_shardz (did you mean --num_shards?)`\n")
    assert [(f, p) for _, f, p in _unknown(text, programs)] == [
        ("--no_write_index", "any"), ("--sharding", "build"), ("--out", "readers.__main__")]

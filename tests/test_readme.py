"""The documentation's examples are what the code does: README.md and every docs/*.md.

``pdlsim predict``, ``sweep``, ``workload``, ``collective`` and ``hardware`` are deterministic
for a given profile and seed, so every such example a newcomer reads is run again here against
the packaged profile: a change to the model or a refreshed profile that leaves the docs behind
fails this test instead of misleading readers. Every ``python`` block runs too, each in a fresh
namespace in a scratch directory; a block whose first line is a comment starting ``# needs`` (a
run directory from ``pdlsim train``, say) is only compiled. Every relative link must point to a
file that exists (and a ``#heading`` in it), and the README stays short enough to read.
Measurements (``bench``, ``train``, ``validate``) are not rerun: they are this machine's
moments. A line ``...`` in an example elides output; the shown runs of lines must appear in
that order, each run contiguous.

After a change that moves these outputs on purpose, ``python -m tests.test_readme --update``
rewrites the examples of the README and docs/*.md from what the code prints now (an elided
example keeps its shape: its first run is the output's first lines, a last run after ``...`` its
last lines).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdlsim.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = (README, *sorted((ROOT / "docs").glob("*.md")))
RERUN = ("predict", "sweep", "workload", "collective", "hardware")  # deterministic subcommands
README_MAX_LINES = 220


@dataclass(frozen=True)
class Example:
    line: int  # where the command stands in its file, 1-based
    command: str  # as shown, continuation lines joined
    shown: tuple[str, ...]  # the output lines that follow it
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def readme_examples(text: str, source: str = "README.md") -> list[Example]:
    """Every ``$ pdlsim <RERUN> ...`` line in a fenced block, with the lines it shows."""
    examples: list[Example] = []
    lines = text.splitlines()
    in_block, i = False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if not (in_block and line.startswith("$ pdlsim ")):
            i += 1
            continue
        start, command = i + 1, line[2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1].rstrip() + " " + lines[i].strip()
        shown = []
        i += 1
        while i < len(lines) and not lines[i].startswith(("$ ", "```")):
            shown.append(lines[i].rstrip())
            i += 1
        if command.split()[1] in RERUN:
            examples.append(Example(start, command.split("#")[0].strip(), tuple(shown), source))
    return examples


def apply_filter(output: list[str], stage: str) -> list[str]:
    """The shell filters the README pipes into: ``sed -n A,Bp`` / ``sed -n Ap``, ``grep W``."""
    words = shlex.split(stage)
    if words[:2] == ["sed", "-n"] and (m := re.fullmatch(r"(\d+)(?:,(\d+))?p", words[2])):
        first = int(m.group(1))
        last = int(m.group(2) or first)
        return output[first - 1 : last]
    if words[0] == "grep" and len(words) == 2:
        return [line for line in output if words[1] in line]
    raise ValueError(f"README example pipes into {stage!r}, which this test cannot replay")


def runs_of_lines(shown: tuple[str, ...]) -> list[list[str]]:
    """The shown lines split at ``...``, blank runs dropped."""
    runs: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(line)
    return [r for r in runs if r]


def appears_in_order(runs: list[list[str]], output: list[str]) -> bool:
    at = 0
    for run in runs:
        for k in range(at, len(output) - len(run) + 1):
            if output[k : k + len(run)] == run:
                at = k + len(run)
                break
        else:
            return False
    return True


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


EXAMPLES = [e for doc in DOCS for e in readme_examples(doc.read_text(), _name(doc))]


def test_the_docs_have_the_examples_this_test_is_for():
    commands = [e.command.split()[1] for e in EXAMPLES]
    assert commands.count("predict") >= 8 and "sweep" in commands and "workload" in commands
    in_readme = [e.command.split()[1] for e in EXAMPLES if e.source == "README.md"]
    assert "predict" in in_readme and "sweep" in in_readme
    assert all(e.shown for e in EXAMPLES), [e.id for e in EXAMPLES if not e.shown]


def printed(example: Example) -> list[str]:
    """What the example's command prints now (through its filters), run in a scratch
    directory: ``sweep --out`` writes relative to where it runs."""
    command, *filters = example.command.split("|")
    here, out = Path.cwd(), io.StringIO()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        try:
            with contextlib.redirect_stdout(out):
                status = main(shlex.split(command)[1:])
        finally:
            os.chdir(here)
    if status != 0:
        raise AssertionError(f"{example.id}: {example.command} exited with {status}")
    output = [line.rstrip() for line in out.getvalue().splitlines()]
    for stage in filters:
        output = apply_filter(output, stage)
    return output


def elided(example: Example) -> bool:
    return any(line.strip() == "..." for line in example.shown)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_readme_example_output_is_what_the_code_prints(example):
    output = printed(example)
    runs = runs_of_lines(example.shown)
    if not elided(example):
        assert output == runs[0], f"{example.id}: {example.command}"
    else:
        assert appears_in_order(runs, output), f"{example.id}: {example.command}\n" + "\n".join(
            output
        )


def refreshed(example: Example, output: list[str]) -> list[str]:
    """The example's shown lines made from ``output``, in the example's shape."""
    if not elided(example):
        return output
    shape = [line.strip() == "..." for line in example.shown]
    if all(shape):  # nothing shown but the elision: nothing to refresh
        return list(example.shown)
    runs = runs_of_lines(example.shown)
    if len(runs) > 2 or (len(runs) == 2 and shape[-1]) or shape[0]:
        raise ValueError(f"{example.id}: only a head, '...' and a tail can be refreshed")
    head = output[: len(runs[0])]
    if len(runs) == 1:
        return [*head, "..."]
    return [*head, "...", *output[len(output) - len(runs[1]) :]]


def update_readme(path: Path = README) -> int:
    """Rewrite every example's shown lines in ``path`` from the code: how many changed."""
    lines = path.read_text().splitlines(keepends=True)
    changed = 0
    examples = readme_examples("".join(lines), _name(path))
    for example in sorted(examples, key=lambda e: -e.line):
        # the command's last line (continued with a backslash), then its output
        start = next(
            i for i in range(example.line - 1, len(lines)) if not lines[i].rstrip().endswith("\\")
        )
        new = [f"{line}\n" for line in refreshed(example, printed(example))]
        old = lines[start + 1 : start + 1 + len(example.shown)]
        if new != old:
            lines[start + 1 : start + 1 + len(example.shown)] = new
            changed += 1
    path.write_text("".join(lines))
    return changed


def test_elided_runs_must_appear_in_order_and_whole():
    output = ["a", "b", "c", "d"]
    assert appears_in_order([["a", "b"], ["d"]], output)
    assert not appears_in_order([["d"], ["a"]], output)
    assert not appears_in_order([["a", "c"]], output)
    assert apply_filter(output, " sed -n 2,3p") == ["b", "c"]
    assert apply_filter(output, "sed -n 4p") == ["d"]
    assert apply_filter(["x ok", "y"], "grep ok") == ["x ok"]
    with pytest.raises(ValueError, match="cannot replay"):
        apply_filter(output, "awk '{print $1}'")


@dataclass(frozen=True)
class PythonBlock:
    source: str
    line: int  # the opening fence's line, 1-based
    code: str

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def compile_only(self) -> bool:
        return self.code.lstrip().startswith("# needs")


def python_blocks(text: str, source: str) -> list[PythonBlock]:
    """Every fenced block opened with ```python, as written."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(PythonBlock(source, start, "\n".join(body) + "\n"))
        i += 1
    return blocks


BLOCKS = [b for doc in DOCS for b in python_blocks(doc.read_text(), _name(doc))]


def test_the_readme_shows_the_python_api():
    readme = [b for b in BLOCKS if b.source == "README.md"]
    assert readme and not any(b.compile_only for b in readme)
    assert any("import pdlsim" in b.code and "pdlsim.predict(" in b.code for b in readme)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_python_example_runs(block):
    code = compile(block.code, block.id, "exec")
    if block.compile_only:
        return
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(io.StringIO()):
        os.chdir(scratch)
        try:
            exec(code, {"__name__": "__doc_example__"})
        finally:
            os.chdir(here)


def test_the_readme_stays_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    heads, in_block = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block and (m := re.match(r"#+ (.*)", line)):
            heads.add(anchor(m.group(1)))
    return heads


def relative_links(path: Path) -> list[str]:
    """The targets of ``[text](target)`` links outside code blocks that are not URLs."""
    found, in_block = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block:
            found += [t for t in LINK.findall(line) if not re.match(r"[a-z]+:", t)]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_relative_links_point_to_existing_files(doc):
    broken = []
    for target in relative_links(doc):
        file, _, heading = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif heading and path.suffix == ".md" and heading not in anchors(path):
            broken.append(target)
    assert not broken, f"{_name(doc)}: broken links {broken}"


def test_anchors_and_links_are_found_as_github_makes_them():
    assert anchor("What `pdlsim calibrate` fits, term by term") == (
        "what-pdlsim-calibrate-fits-term-by-term"
    )
    assert anchor("Assumptions and known limits") == "assumptions-and-known-limits"
    assert LINK.findall("see [a](x.md#y) and [b](https://e.org) `[c](z)`") == [
        "x.md#y",
        "https://e.org",
        "z",
    ]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.test_readme --update")
    for doc in DOCS:
        print(f"{_name(doc)}: {update_readme(doc)} examples rewritten from the code")

# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every command the README and the guides show is run here, and the output they show is what it prints.

Each console block of the documents below carries a tag on the line before it (an RST comment
``.. docs-test: ...`` or, in Markdown, ``<!-- docs-test: ... -->``):

- ``run``: each ``$ `` command of the block runs, in order, in one shell per document (started in the
  checkout, so ``. <env>`` holds for the next commands); the lines shown under a command are what it
  must print (stdout and stderr), ``<demo>`` standing for this checkout's demo directory, ``<pid>`` for
  any number, ``<uuid>`` for a GPU's UUID, and a line ``...`` for any lines. A command shown without output must exit 0.
- ``run, except "<command>": <reason>``: the same, the named command not run, for the reason given.
- ``skip: <reason>``: the block cannot run here (a real fleet, a registry); the reason says why.
- ``output of "<command>"``: a text block whose lines must appear, in order and together, in the output
  of that command's last run above the block (by a ``run`` block of the same document).
- ``message``: a text block quoting a message, which tests/docs/test_quoted_messages.py finds in what a
  situation of tests/docs/messages.yml printed.
- ``engines <name>``: a text block quoting what a real engine printed, which the engines test ``<name>`` finds in its
  own output (tests/engines/quoted.py; ``make engines``).

A console block without a tag, or a skip without a reason, fails the test: nothing shown goes untested
without saying why.  Run by ``make docs-commands`` (part of ``make test``), with TEST_ROOT set as the
Makefile sets it; ``make demo`` and ``make demo-clean`` run for real, on the simulated host.
"""
from __future__ import annotations

import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
DOCS = ['README.md', 'docs/docsite/rst/guide_quickstart.rst', 'docs/docsite/rst/guide_troubleshooting.rst',
        'docs/docsite/rst/guide_awx.rst', 'docs/docsite/rst/guide_simulated_host.rst']
TAG_RE = re.compile(r'^\s*(?:\.\. docs-test: (?P<rst>.*?)|<!-- docs-test: (?P<md>.*?) -->)\s*$')
EXCEPT_RE = re.compile(r'^run, except "(?P<command>[^"]+)": (?P<reason>\S.*)$')
OUTPUT_RE = re.compile(r'^output of "(?P<command>[^"]+)"$')
PROMPTS = ('$ ', '# ')


@dataclass
class Command:
    """One shown command and the lines shown under it."""

    text: str
    shown: List[str] = field(default_factory=list)


@dataclass
class Block:
    """A console (or tagged text) block of a document."""

    doc: str
    line: int
    kind: str
    tag: Optional[str]
    lines: List[str]

    def commands(self) -> List[Command]:
        """The block's commands (continuation lines joined) with their shown output."""
        out: List[Command] = []
        pending = ''
        for line in self.lines:
            if pending:
                pending += '\n' + line
                if not line.endswith('\\'):
                    out.append(Command(pending))
                    pending = ''
            elif line.startswith(PROMPTS):
                text = line[2:]
                if text.endswith('\\'):
                    pending = text
                else:
                    out.append(Command(text))
            elif out:
                out[-1].shown.append(line)
        return out


def blocks(doc: str) -> List[Block]:
    """The console blocks of a document (and the text blocks tagged ``output of``), with their tags."""
    with open(os.path.join(REPO, doc), encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    found: List[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        rst = re.match(r'^(\s*)\.\. code-block:: (\w+)\s*$', line)
        md = re.match(r'^```(\w+)\s*$', line)
        if not (rst or md):
            i += 1
            continue
        kind = (rst or md).group(2 if rst else 1)
        tag = None
        for back in range(i - 1, max(i - 4, -1), -1):
            match = TAG_RE.match(lines[back])
            if match:
                tag = match.group('rst') or match.group('md')
                break
        body: List[str] = []
        j = i + 1
        if rst:
            indent = None
            while j < len(lines) and (not lines[j].strip() or indent is None or lines[j].startswith(indent)):
                if lines[j].strip() and indent is None:
                    indent = re.match(r'^\s*', lines[j]).group()
                body.append(lines[j][len(indent):] if indent and lines[j].startswith(indent) else '')
                j += 1
            while body and not body[0]:
                body.pop(0)
            while body and not body[-1]:
                body.pop()
        else:
            while j < len(lines) and not lines[j].startswith('```'):
                body.append(lines[j])
                j += 1
        if kind == 'console' or tag is not None:
            found.append(Block(doc, i + 1, kind, tag, body))
        i = j + 1
    return found


ALL = [block for doc in DOCS for block in blocks(doc)]


@pytest.mark.parametrize('block', ALL, ids=[f'{b.doc}:{b.line}' for b in ALL])
def test_every_console_block_says_whether_it_runs_and_why_not(block: Block) -> None:
    assert block.tag is not None, f'{block.doc}:{block.line}: a {block.kind} block without a docs-test tag'
    tag = block.tag
    if tag.startswith('skip'):
        assert re.match(r'^skip: \S.{9,}', tag), f'{block.doc}:{block.line}: a skip needs its reason'
    else:
        known = tag in ('run', 'message') or tag.startswith('engines ') or EXCEPT_RE.match(tag) or OUTPUT_RE.match(tag)
        assert known, f'{block.doc}:{block.line}: unknown tag {tag!r}'
        if tag.startswith('run'):
            assert block.commands(), f'{block.doc}:{block.line}: a run block without a command'


def pattern(line: str, demo: str) -> str:
    """A shown line as a regular expression for the printed one."""
    text = re.escape(line.rstrip())
    text = text.replace(re.escape('<pid>'), r'\d+').replace(re.escape('<uuid>'), r'GPU-[0-9a-f-]+').replace(re.escape('<demo>'), re.escape(demo))
    return re.sub(' +', lambda _m: r'[ \t]+', text.replace(r'\ ', ' '))


def matches(shown: List[str], printed: List[str], demo: str, contiguous: bool = True) -> Optional[str]:
    """None when the shown lines are what was printed (``...`` for any lines), else why not."""
    want = list(shown)
    got = [line.rstrip() for line in printed]
    regex = ''
    for line in want:
        regex += r'(?:.*\n)*?' if line.strip() == '...' else pattern(line, demo) + r'\n'
    target = '\n'.join(got) + '\n'
    found = re.fullmatch(regex, target) if contiguous else re.search(r'(?:^|\n)' + regex, target)
    if found:
        return None
    return 'shown:\n  ' + '\n  '.join(want) + '\nprinted:\n  ' + '\n  '.join(got[-60:])


def run_document(doc: str, demo: str) -> Dict[Tuple[int, int], subprocess.CompletedProcess]:
    """Run the document's run blocks in one bash session; each command's output, by (block line, command index)."""
    marker = uuid.uuid4().hex
    # ls in columns, as a terminal shows it (a pipe gets one name per line)
    script = ['set +e', 'shopt -s expand_aliases', "alias ls='ls -C'", 'export COLUMNS=110', f'cd {REPO}']
    keys: List[Tuple[int, int]] = []
    texts: List[str] = []
    for block in blocks(doc):
        if block.tag is None or not block.tag.startswith('run'):
            continue
        skipped = EXCEPT_RE.match(block.tag)
        for position, command in enumerate(block.commands()):
            if skipped and command.text.split('#')[0].strip() == skipped.group('command'):
                continue
            keys.append((block.line, position))
            texts.append(command.text)
            n = len(keys) - 1
            script += [f'echo "{marker} start {n}"', f'{command.text.replace("<demo>", demo)} 2>&1', f'echo "{marker} end {n} $?"']
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_'))}
    proc = subprocess.run(['bash', '-c', '\n'.join(script)], capture_output=True, text=True, env=env, timeout=1200, check=False)
    results: Dict[Tuple[int, int], subprocess.CompletedProcess] = {}
    for n, key in enumerate(keys):
        found = re.search(rf'{marker} start {n}\n(.*?){marker} end {n} (\d+)\n', proc.stdout, re.S)
        results[key] = subprocess.CompletedProcess(texts[n], int(found.group(2)) if found else -1,
                                                   found.group(1) if found else proc.stdout[-3000:] + proc.stderr[-2000:])
    return results


RUN_DOCS = sorted({block.doc for block in ALL if block.tag and block.tag.startswith('run')})


@pytest.mark.parametrize('doc', RUN_DOCS)
def test_documented_commands_print_what_the_document_shows(doc: str) -> None:
    test_root = os.environ.get('TEST_ROOT')
    if not test_root:
        pytest.fail('TEST_ROOT is not set: run this through make docs-commands, which sets it as every make target does')
    demo = os.path.join(test_root, 'demo')
    results = run_document(doc, demo)
    problems = []
    for block in blocks(doc):
        if block.tag is None:
            continue
        if block.tag.startswith('run'):
            for position, command in enumerate(block.commands()):
                result = results.get((block.line, position))
                if result is None:
                    continue
                printed = result.stdout.rstrip('\n').split('\n') if result.stdout.strip() else []
                if result.returncode != 0:
                    problems.append(f'{doc}:{block.line}: `{command.text}` exited {result.returncode}:\n' + '\n'.join(printed[-40:]))
                elif command.shown and (why := matches(command.shown, printed, demo)):
                    problems.append(f'{doc}:{block.line}: `{command.text}`\n{why}')
        elif OUTPUT_RE.match(block.tag):
            # the last run of that command above this block
            wanted = OUTPUT_RE.match(block.tag).group('command')
            earlier = [key for key, result in results.items() if result.args == wanted and key[0] < block.line]
            source = results[max(earlier)] if earlier else None
            if source is None:
                problems.append(f'{doc}:{block.line}: the output of a command no run block above it in {doc} runs')
            elif (why := matches(block.lines, source.stdout.rstrip('\n').split('\n'), demo, contiguous=False)):
                problems.append(f'{doc}:{block.line}: not in the output of `{source.args}`\n{why}')
    assert not problems, '\n\n'.join(problems)

# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet.mps contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""No positional booleans in the collection's code: a ``bool`` parameter is keyword-only, and no call passes
``True``/``False`` positionally (``manager.plan('absent', 'all', False, mode, False, ...)`` said nothing to its reader)."""

from __future__ import annotations

import ast
import os

import pytest

PLUGINS = os.path.normpath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins'))
BOOL = ('bool', 't.Optional[bool]', 'Optional[bool]')
DEFAULTS = ('get', 'pop', 'setdefault')


def _trees():
    for top, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if name.endswith('.py'):
                path = os.path.join(top, name)
                with open(path, encoding='utf-8') as handle:
                    yield os.path.relpath(path, PLUGINS), ast.parse(handle.read())


def positional_bool_parameters(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.posonlyargs + node.args.args:
                if arg.annotation is not None and ast.unparse(arg.annotation) in BOOL:
                    yield '%s(%s) line %d' % (node.name, arg.arg, node.lineno)


def positional_bool_arguments(tree):
    for node in ast.walk(tree):
        # A mapping's default (d.get('k', False), d.pop('k', True)) is the one positional boolean that needs no name.
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr in DEFAULTS):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, bool):
                    yield '%s line %d' % (ast.unparse(node)[:80], node.lineno)


def test_the_checks_see_what_they_look_for():
    bad = ast.parse('def plan(state: str, force: bool) -> None:\n    pass\nplan("absent", False)\n')
    assert list(positional_bool_parameters(bad)) == ['plan(force) line 1']
    assert list(positional_bool_arguments(bad)) == ["plan('absent', False) line 3"]
    good = ast.parse('def plan(state: str, *, force: bool) -> None:\n    pass\nplan("absent", force=False)\nd.get("k", False)\n')
    assert not list(positional_bool_parameters(good))
    assert not list(positional_bool_arguments(good))


@pytest.mark.parametrize('check', [positional_bool_parameters, positional_bool_arguments])
def test_no_positional_booleans(check):
    found = ['%s: %s' % (path, where) for path, tree in _trees() for where in check(tree)]
    assert not found, '\n'.join(found)

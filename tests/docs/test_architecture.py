# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The architecture page and the code agree: every file of ``plugins/module_utils`` is named on it, and every file,
class and function it names exists - so the page cannot silently go stale when code moves (issue 41)."""
from __future__ import annotations

import ast
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
UTILS = os.path.join(REPO, 'plugins', 'module_utils')
PAGE = os.path.join(REPO, 'docs', 'docsite', 'rst', 'dev_architecture.rst')
# Names of other projects the page uses: ansible-core's, systemd's, Slurm's.
EXTERNAL = {'AnsibleModule', 'ExecStartPost', 'TaskProlog', 'EnvironmentFile', 'BindPaths'}


def utils_files():
    found = []
    for dirpath, _dirs, files in os.walk(UTILS):
        found += [os.path.relpath(os.path.join(dirpath, name), UTILS) for name in files
                  if name.endswith('.py') and name != '__init__.py']
    return sorted(found)


def page():
    with open(PAGE, encoding='utf-8') as handle:
        return handle.read()


def defined_names():
    """Every class, function and method name defined under plugins/ and tests/fakes/, with the classes' attributes."""
    names, attributes = set(), {}
    for top in (os.path.join(REPO, 'plugins'), os.path.join(REPO, 'tests', 'fakes'), os.path.join(REPO, 'tests', 'unit')):
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                if not name.endswith('.py'):
                    continue
                with open(os.path.join(dirpath, name), encoding='utf-8') as handle:
                    tree = ast.parse(handle.read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(node.name)
                    if isinstance(node, ast.ClassDef):
                        own = attributes.setdefault(node.name, set())
                        for item in ast.walk(node):
                            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                                own.add(item.name)
                            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                                own.add(item.target.id)
                            elif isinstance(item, ast.Assign):
                                own.update(target.id for target in item.targets if isinstance(target, ast.Name))
                    elif isinstance(node, ast.Assign):
                        names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names, attributes


def test_every_module_utils_file_is_named_on_the_page():
    text = page()
    missing = [path for path in utils_files() if path not in text]
    assert missing == [], 'named nowhere on %s: %s' % (os.path.relpath(PAGE, REPO), missing)


def test_every_file_the_page_names_exists():
    text = page()
    files = utils_files()
    bare = {os.path.basename(path) for path in files}
    wrong = []
    for cited in sorted(set(re.findall(r'[\w./-]*\w\.py\b', text))):
        if cited.startswith(('tests/', 'plugins/', 'hacking/', 'bench/')):
            ok = os.path.exists(os.path.join(REPO, cited))
        elif '/' in cited:
            ok = cited in files
        elif cited.startswith('test_'):
            ok = any(cited in files for _dirpath, _dirs, files in os.walk(os.path.join(REPO, 'tests')))
        else:
            ok = cited in bare or cited.startswith('mps_') and os.path.exists(os.path.join(REPO, 'plugins', 'modules', cited))
        if not ok:
            wrong.append(cited)
    assert wrong == [], 'the page names files that do not exist: %s' % wrong


def test_every_class_and_function_the_page_names_exists():
    text = page()
    names, attributes = defined_names()
    wrong = []
    # CamelCase names (classes) anywhere, with an attribute after a dot; snake_case names only as ``code`` with ().
    for match in re.finditer(r'\b([A-Z][a-z0-9]+[A-Z]\w*)(?:\.(\w+))?', text):
        cls, attribute = match.group(1), match.group(2)
        if cls in EXTERNAL:
            continue
        if cls not in names:
            wrong.append(cls)
        elif attribute and attribute not in attributes.get(cls, set()) and not attribute[0].isupper():
            wrong.append('%s.%s' % (cls, attribute))
    for function in re.findall(r'\b(_?[a-z]\w*)\(\)', text):
        if function not in names:
            wrong.append(function + '()')
    assert sorted(set(wrong)) == [], 'the page names what the code does not define: %s' % sorted(set(wrong))

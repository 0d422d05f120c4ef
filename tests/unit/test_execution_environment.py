# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The execution-environment files parse and name every third-party package the plugins import."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# import name -> distribution that provides it
DISTRIBUTIONS = {'pynvml': 'nvidia-ml-py'}


def third_party_imports():
    found = set()
    for path in (ROOT / 'plugins').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split('.')[0]
                if top not in sys.stdlib_module_names and top not in ('ansible', 'ansible_collections', '__future__'):
                    found.add(top)
    return found


def test_execution_environment_metadata_points_at_the_files():
    meta = yaml.safe_load((ROOT / 'meta' / 'execution-environment.yml').read_text())
    assert meta['version'] == 1
    assert meta['dependencies'] == {'python': 'requirements.txt', 'system': 'bindep.txt'}
    for name in meta['dependencies'].values():
        assert (ROOT / name).is_file()


def test_requirements_name_every_third_party_import_of_the_plugins():
    lines = [line.strip() for line in (ROOT / 'requirements.txt').read_text().splitlines()]
    requirements = {Requirement(line).name for line in lines if line and not line.startswith('#')}
    imports = third_party_imports()
    assert imports == set(DISTRIBUTIONS), 'a plugin imports a package this test does not know: %s' % imports
    assert {DISTRIBUTIONS[name] for name in imports} <= requirements


def test_nvidia_ml_py_is_required_at_a_version_that_returns_str():
    requirement = [Requirement(line) for line in (ROOT / 'requirements.txt').read_text().splitlines()
                   if line.strip() and not line.startswith('#')][0]
    assert requirement.name == 'nvidia-ml-py' and '11.525' not in requirement.specifier and requirement.specifier.contains('12.535.161')
    assert not requirement.specifier.contains('11.515.75')


def test_bindep_has_only_comments_or_valid_entries():
    for line in (ROOT / 'bindep.txt').read_text().splitlines():
        line = line.strip()
        assert not line or line.startswith('#') or line.split()[0].replace('-', '').replace('.', '').isalnum()

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MPS v3 (protocol 3, driver r615 and later): one named server per resource, its namespaces, the TOML file of ``-a``.

Imported only where a resource asks for protocol 3 or a start record says it runs with it: a legacy fleet never
compiles it. What v3 does is inferred from NVIDIA's pages (``shared/mps-v3-reference.md``); no r615 GPU has run it.
"""

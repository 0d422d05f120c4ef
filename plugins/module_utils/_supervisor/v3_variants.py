# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The MPS v3 variants of the files around a daemon: what replaces the legacy words in the scripts and units of a host
that has a v3 resource (mps-v3-reference 1.2, 1.3). Imported only there: on every other host those files stay byte for
byte what they were, and this module is never compiled."""

from __future__ import annotations

import typing as t

from .._errors import MpsError


def replaced(text: str, pairs: t.Sequence[t.Tuple[str, str]], what: str) -> str:
    """``text`` with each legacy piece of ``pairs`` replaced by its v3 one; each must be there exactly once."""
    for legacy, v3_text in pairs:
        if text.count(legacy) != 1:
            raise MpsError('internal error: %s has %d places for its MPS v3 part' % (what, text.count(legacy)))
        text = text.replace(legacy, v3_text)
    return text


# quit is a legacy word: a daemon started with -p 3 stops with -q ("Quit and stop the control daemon and all running
# servers" [mps-v3-reference 1.2]); whether -q waits for clients as quit -t does is unknown. A drop-in of the v3 resources
# only: the template, which every resource shares, stays as legacy hosts have it.
DROPIN_V3 = """\
# Managed by the gpufleet.mps Ansible collection (mps_host, a resource with protocol: 3). Local changes are overwritten.
# The daemon runs MPS v3 (started with -p 3 -a <its file>, MPS_DAEMON_ARGS): it is stopped with -q, not with quit.
[Service]
ExecStop=
ExecStop=-/bin/sh -c 'exec "$$MPS_CONTROL" -q'
"""

# The foreground drop-in (Type=exec) waits for the daemon before its replay: a v3 daemon is asked whether it lists its
# server (MPS_V3_SERVER) - the legacy question is not a v3 word.
_LEGACY_WAIT = 'until echo get_default_active_thread_percentage | "$$MPS_CONTROL" > /dev/null 2>&1; do'
_V3_WAIT = ('until "$$MPS_CONTROL" namespace list --server="$$MPS_V3_SERVER" --format=csv,noheader 2> /dev/null '
            '| grep -q "^default,$$MPS_V3_SERVER,"; do')
FOREGROUND_V3 = ((_LEGACY_WAIT, _V3_WAIT),)

# Where a resource of the host runs MPS v3 (MPS_V3_SERVER in its environment file) its daemon is asked with v3 words
# (ask_v3): these replace their legacy lines in that host's script only; the others stay byte for byte.
METRICS_V3 = (
    ("""family() {  # a metric family""",
     """ask_v3() {  # an MPS v3 daemon (server $4): its namespace and client lists, read into what ask sets (two UI processes)
  answered=0 complete=0 ratio=- servers=- clients=- unasked=- limits=- cpids=-
  answer=$(CUDA_MPS_PIPE_DIRECTORY="$1" timeout "$timeout_s" "$2" namespace list --server="$4" --format=csv,noheader 2>"$errors")
  rc=$?
  if [ "$rc" -ne 0 ]; then
    # it answered, refusing (its server is gone: "not found"): not the answer wanted (bad_answer)
    printf '%s\\n' "$answer" | grep -q "^Error" && rc=0
    return 0
  fi
  # the default namespace's row (spaces after the commas tolerated), the server Ready: what the module and the plain
  # check call a healthy v3 daemon (_v3.readout.V3Readout.ready)
  line=$(printf '%s\\n' "$answer" | sed 's/,[[:space:]]*/,/g' | grep -m 1 "^default,$4,")
  [ -n "$line" ] || return 0
  printf '%s\\n' "$line" | cut -d, -f3 | grep -qix ready || return 0
  answered=1
  list=$(CUDA_MPS_PIPE_DIRECTORY="$1" timeout "$timeout_s" "$2" client list --server="$4" --format=csv,noheader 2>>"$errors")
  rc=$?
  [ "$rc" -eq 0 ] || return 0
  list=$(printf '%s\\n' "$list" | sed 's/,[[:space:]]*/,/g')
  clients=$(printf '%s\\n' "$list" | grep -c "^[0-9][0-9]*,$4,")
  cpids=$(printf '%s\\n' "$list" | sed -n "s/^\\([0-9][0-9]*\\),$4,.*/\\1/p" | tr '\\n' ',')
  cpids=${cpids%,}
  [ -n "$cpids" ] || cpids=-
  read -r ratio limits <<EOF
$(printf '%s\\n' "$line" | awk -F, -v ordinals="$3" '{
  # an unset limit printed in any of the forms the module reads as unset (_v3.readout); a form it cannot read: no sample
  pct = tolower($5); mem = toupper($4); unset = "^(|-|none|n/a|unset)$"
  ratio = (pct ~ /^[0-9]+([.][0-9]+)?$/) ? sprintf("%.4g", pct / 100) : (pct ~ unset ? "1" : "-")
  value = "-"
  if (mem ~ /^[0-9]+[KMG](I?B)?$/ && mem + 0 > 0) value = sprintf("%.0f", (mem + 0) * (mem ~ /G/ ? 1073741824 : mem ~ /M/ ? 1048576 : 1024))
  limits = ""
  for (i = 1; i <= ordinals; i++) limits = limits (i > 1 ? "," : "") value
  print ratio " " (limits == "" ? "-" : limits)
}')
EOF
  servers=1 complete=1
}

family() {  # a metric family"""),
    ("""  pipe='' control='' devices=''
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      CUDA_MPS_PIPE_DIRECTORY=*) pipe=${line#*=} ;;
      MPS_CONTROL=*) control=${line#*=} ;;""",
     """  pipe='' control='' devices='' server=''
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      CUDA_MPS_PIPE_DIRECTORY=*) pipe=${line#*=} ;;
      MPS_CONTROL=*) control=${line#*=} ;;
      MPS_V3_SERVER=*) server=${line#*=} ;;"""),
    ("""  ask "$pipe" "$control" "$ordinals" "$candidates"
  if [ "$rc" -eq 0 ] && [ "$complete" = 1 ] && [ "$unasked" != - ]; then""",
     """  if [ -n "$server" ]; then
    ask_v3 "$pipe" "$control" "$ordinals" "$server"
  else
    ask "$pipe" "$control" "$ordinals" "$candidates"
  fi
  if [ -z "$server" ] && [ "$rc" -eq 0 ] && [ "$complete" = 1 ] && [ "$unasked" != - ]; then"""),
)

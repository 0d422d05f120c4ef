# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check with metrics (``render_health(metrics_dir=...)``): the same checks and ready mark as the plain
script, and what it saw, written to ``<metrics_dir>/gpufleet_mps.prom`` for node_exporter's textfile collector."""

from __future__ import annotations

# The textfile node_exporter's textfile collector reads (only files named *.prom: the temp file is not one).
from .health import METRICS_FILE  # noqa: F401  pylint: disable=unused-import
from .metrics_table import ERROR_REASONS, METRICS

# The script with metrics: SCRIPT_TEMPLATE's checks and ready mark, one control UI process per daemon, and the
# textfile. Placeholders as SCRIPT_TEMPLATE's, and @METRICS_DIR@, @ROOT_LABEL@ (the root as a label value), and
# @HELP_<metric>@ and @REASONS@.
METRICS_SCRIPT_TEMPLATE = r"""#!/bin/sh
# Managed by the gpufleet.mps Ansible collection (fleet role). Local changes are overwritten.
# Writes @ROOT@/.ready when every MPS daemon of the root answers its health question, withdraws it otherwise,
# and writes what it saw to @METRICS_DIR@/gpufleet_mps.prom for node_exporter's textfile collector.
root='@ROOT@'
config_dir='@CONFIG_DIR@'
wants='@WANTS_DIR@'
timeout_s=@TIMEOUT@
metrics_dir='@METRICS_DIR@'
root_label='@ROOT_LABEL@'
prom="$metrics_dir/gpufleet_mps.prom"
# node_exporter reads only *.prom files: it never sees this one half-written.
tmp="$metrics_dir/.gpufleet_mps.prom.$$"
errors="$metrics_dir/.gpufleet_mps.stderr.$$"
trap 'rm -f "$metrics_dir/.gpufleet_mps.prom.$$" "$metrics_dir/.gpufleet_mps.stderr.$$"' EXIT
trap 'exit 1' HUP INT TERM
[ -d "$metrics_dir" ] && [ -w "$metrics_dir" ] || errors=/dev/null
export LC_ALL=C
nl='
'
sentinel=get_default_active_thread_percentage
# shellcheck disable=SC2016  # an awk program: its $ are awk's
# The answer of one batch (framed as the modules frame theirs: the health answer, then each reply followed by the
# sentinel's percentage): "answered complete ratio servers clients unasked limits pids" (pids: the clients', comma
# separated), "-" for what is unknown.
parse='
BEGIN { blocks = -1; body = ""; junk = 0 }
{ gsub(/[ \t\r]+/, " "); sub(/^ /, ""); sub(/ $/, "") }
$0 == "" { next }
/^[0-9]+[.][0-9]+$/ {
  if (blocks < 0) { health = $0; blocks = 0 } else { text[blocks] = body; blocks++; body = "" }
  next
}
{ if (blocks < 0) junk = 1; else body = body " " $0 }
END {
  if (junk || blocks < 0 || health !~ /^[0-9]+[.][0-9]$/) { print "0 0 - - - - - -"; exit }
  ratio = sprintf("%.4g", health / 100)
  nc = split(candidates, cand, " ")
  if (blocks != 1 + ordinals + nc || body != "" || !ints(text[0])) { print "1 0 " ratio " - - - - -"; exit }
  ns = split(text[0], listed, " ")
  for (i = 1; i <= ns; i++) server[listed[i]] = 1
  clients = 0
  cpids = ""
  for (j = 1; j <= nc; j++) {
    asked[cand[j]] = 1
    if ((cand[j] in server) && ints(text[ordinals + j])) {
      n = split(text[ordinals + j], pids, " ")
      clients += n
      for (k = 1; k <= n; k++) cpids = cpids (cpids == "" ? "" : ",") pids[k]
    }
  }
  unasked = ""
  for (i = 1; i <= ns; i++) if (!(listed[i] in asked)) unasked = unasked (unasked == "" ? "" : ",") listed[i]
  limits = ""
  for (i = 1; i <= ordinals; i++) {
    t = text[i]; sub(/^ /, "", t); value = "-"
    if (t ~ /^[0-9]+[MG]$/ && t + 0 > 0) value = sprintf("%.0f", (t + 0) * (t ~ /G$/ ? 1073741824 : 1048576))
    limits = limits (i > 1 ? "," : "") value
  }
  print "1 1 " ratio " " ns " " clients " " (unasked == "" ? "-" : unasked) " " (limits == "" ? "-" : limits) " " (cpids == "" ? "-" : cpids)
}
function ints(s) { return s ~ /^( [0-9]+)*$/ }
'

uptime_cs() {  # the uptime in hundredths of a second, in $cs ("" where /proc/uptime cannot tell)
  cs=''
  [ -r /proc/uptime ] && read -r up _ < /proc/uptime || return 0
  case $up in
    [0-9]*.[0-9][0-9]) frac=${up#*.}; cs=$((${up%.*} * 100 + ${frac#0})) ;;  # 09 is no octal number
  esac
}

escape() {  # $1 as a label value of the exposition format, in $escaped: backslash, double quote and newline escaped
  rest=$1
  escaped=''
  while :; do
    head=${rest%%[\\\""$nl"]*}
    if [ "$head" = "$rest" ]; then escaped=$escaped$rest; return 0; fi
    rest=${rest#"$head"}
    case $rest in
      \\*) escaped="$escaped$head\\\\" ;;
      \"*) escaped="$escaped$head\\\"" ;;
      *) escaped="$escaped$head\\n" ;;
    esac
    rest=${rest#?}
  done
}

alive() {  # process $1 runs (a zombie is dead: a daemon's parent may never reap it)
  [ -r "/proc/$1/stat" ] && IFS= read -r pstat 2>/dev/null < "/proc/$1/stat" || return 1
  pstat=${pstat##*) }
  [ "${pstat%% *}" != Z ]
}

find_daemon() {  # the pid of the live control daemon of pipe directory $1, in $daemon ("" when none runs)
  daemon=''
  [ -r "$1/nvidia-cuda-mps-control.pid" ] && { IFS= read -r daemon 2>/dev/null < "$1/nvidia-cuda-mps-control.pid" || :; }
  case $daemon in '' | *[!0-9]*) daemon='' ;; esac
  # The pid file outlives the daemon: its process must be a control daemon (comm) of this pipe directory (environ).
  if [ -n "$daemon" ] && alive "$daemon" && IFS= read -r comm 2>/dev/null < "/proc/$daemon/comm" \
      && [ "$comm" = nvidia-cuda-mps ] \
      && tr '\0' '\n' < "/proc/$daemon/environ" 2>/dev/null | grep -Fqx "CUDA_MPS_PIPE_DIRECTORY=$1"; then
    return 0
  fi
  daemon=''
  # Else a live holder of the lock on control_lock runs it: the kernel drops the lock when the daemon dies.
  [ -e "$1/control_lock" ] && [ -r /proc/locks ] || return 0
  devino=$(stat -c '%D %i' "$1/control_lock" 2>/dev/null) || return 0
  dev=$((0x${devino% *}))
  key=$(printf '%02x:%02x:%s' $(((dev >> 8 & 0xfff) | (dev >> 32 & ~0xfff))) $(((dev & 0xff) | (dev >> 12 & ~0xff))) "${devino#* }")
  holders=$(awk -v key="$key" '$6 == key && $0 !~ /->/ { print $5 }' /proc/locks)
  for holder in $holders; do
    case $holder in '' | *[!0-9]*) continue ;; esac
    if alive "$holder"; then daemon=$holder; return 0; fi
  done
}

ask() {  # one control UI process for pipe directory $1 (control binary $2, $3 devices, candidate server pids $4)
  batch="$sentinel${nl}get_server_list$nl$sentinel"
  n=0
  while [ "$n" -lt "$3" ]; do
    batch="$batch${nl}get_default_device_pinned_mem_limit $n$nl$sentinel"
    n=$((n + 1))
  done
  for pid in $4; do
    batch="$batch${nl}get_client_list $pid$nl$sentinel"
  done
  answer=$(printf '%s\n' "$batch" | CUDA_MPS_PIPE_DIRECTORY="$1" timeout "$timeout_s" "$2" 2>"$errors")
  rc=$?
  read -r answered complete ratio servers clients unasked limits cpids <<EOF
$(printf '%s\n' "$answer" | awk -v ordinals="$3" -v candidates="$4" "$parse")
EOF
}

# The owner kind of the process whose /proc/<pid>/cgroup is $1, in $owner: as _attribution.owner_kind decides it (a
# unit test holds the two to the same answers over its cited real files). container: a layout of an engine names a
# container id; slurm_job: slurmstepd's cgroup names a job; host: every path in systemd's slices or scopes; else unknown.
container_re='libpod-[0-9a-f]{64}(\.scope)?(/|$)|crio-[0-9a-f]{64}(\.scope)?(/|$)|cri-containerd[-:][0-9a-f]{64}|docker-[0-9a-f]{64}\.scope|/docker/[0-9a-f]{64}(/|$)|/kubepods(/[a-z]+)*/pod[0-9a-f-]+/([0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(/|$)|/[0-9a-f]{64}(\.scope)?(/|$)'
owner_of() {
  owner=unknown
  cgroups=$(sed -n 's/^[^:]*:[^:]*://p' "$1" 2>/dev/null) || return 0
  cgroups=$(printf '%s\n' "$cgroups" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep -v '^$')
  [ -n "$cgroups" ] || return 0
  if printf '%s\n' "$cgroups" | grep -Eq "$container_re"; then owner=container; return 0; fi
  if printf '%s\n' "$cgroups" | grep -Eq '(/slurm(_[^/]+)?/uid_[0-9]+|slurmstepd\.scope)/job_[0-9]+(/|$)'; then owner=slurm_job; return 0; fi
  rest=$(printf '%s\n' "$cgroups" | grep -vx '/')
  [ -n "$rest" ] || return 0
  printf '%s\n' "$rest" | grep -Evq '^(/\.\.)*/(user\.slice|system\.slice|init\.scope|user-[0-9]+\.slice|session-[0-9]+\.scope)(/|$)' && return 0
  printf '%s\n' "$rest" | grep -Eq '[0-9a-f]{64}' && return 0
  owner=host
}

family() {  # a metric family: name $1, type $2, HELP $3, its sample lines $4 (nothing at all without samples)
  [ -n "$4" ] || return 0
  printf '# HELP %s %s\n# TYPE %s %s\n%s' "$1" "$3" "$1" "$2" "$4"
}

uptime_cs
started=$cs
healthy=0
sick=0
seen=''
f_up='' f_answering='' f_error='' f_servers='' f_clients='' f_ratio='' f_limit='' f_device='' f_owner=''
for env in "$config_dir"/*.env; do
  [ -f "$env" ] || continue
  instance=${env##*/}
  instance=${instance%.env}
  [ -e "$wants/gpufleet-mps@$instance.service" ] || continue   # not enabled: pruned or stopped on purpose
  pipe='' control='' devices=''
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      CUDA_MPS_PIPE_DIRECTORY=*) pipe=${line#*=} ;;
      MPS_CONTROL=*) control=${line#*=} ;;
      CUDA_VISIBLE_DEVICES=*) devices=${line#*=} ;;
    esac
  done < "$env"
  case "$pipe" in "$root"/*) ;; *) continue ;; esac
  name=${pipe#"$root"/}
  name=${name%/pipe}
  case "$nl$seen" in *"$nl$name$nl"*) echo "gpufleet-mps-health: $env names the pipe directory of another resource: $pipe" >&2; continue ;; esac
  seen="$seen$name$nl"
  escape "$name"
  labels="root=\"$root_label\",resource=\"$escaped\""
  ordinals=0
  rest_devices=$devices
  while [ -n "$rest_devices" ]; do
    device=${rest_devices%%,*}
    case $rest_devices in *,*) rest_devices=${rest_devices#*,} ;; *) rest_devices='' ;; esac
    escape "$device"
    f_device="${f_device}gpufleet_mps_device_info{$labels,device=\"$ordinals\",uuid=\"$escaped\"} 1$nl"
    ordinals=$((ordinals + 1))
  done
  find_daemon "$pipe"
  candidates=''
  if [ -n "$daemon" ]; then
    children=$(cat "/proc/$daemon"/task/*/children 2>/dev/null)   # its servers are among its children
    for pid in $children; do
      case $pid in *[!0-9]*) continue ;; esac
      case " $candidates " in *" $pid "*) ;; *) candidates="$candidates $pid" ;; esac
    done
  fi
  ask "$pipe" "$control" "$ordinals" "$candidates"
  if [ "$rc" -eq 0 ] && [ "$complete" = 1 ] && [ "$unasked" != - ]; then
    # Servers the daemon lists that /proc did not show as its children: ask again, about every listed one.
    old_ifs=$IFS
    IFS=,
    for pid in $unasked; do candidates="$candidates $pid"; done
    IFS=$old_ifs
    ask "$pipe" "$control" "$ordinals" "$candidates"
  fi
  answering=0
  reason=''
  case $rc in
    0) if [ "$answered" = 1 ]; then answering=1; [ "$complete" = 1 ] || reason=bad_answer; fi ;;
    124) reason=timeout ;;
    126 | 127) reason=control_binary ;;
  esac
  if [ "$answering" = 0 ] && [ -z "$reason" ]; then
    if [ -z "$daemon" ]; then
      reason=not_running
    elif printf '%s\n' "$answer" | cat - "$errors" 2>/dev/null | grep -q 'Cannot find MPS control daemon process'; then
      reason=unreachable
    elif [ "$rc" -eq 0 ]; then
      reason=bad_answer
    else
      reason=ui_failed
    fi
  fi
  up=0
  if [ -n "$daemon" ] || [ "$answering" = 1 ]; then up=1; fi
  # what it printed, on one line of printable ASCII (the journal shows a line with other bytes as a blob)
  detail=''
  if [ -n "$reason" ]; then
    detail=$({ [ -z "$answer" ] || printf '%s\n' "$answer"; cat "$errors"; } 2>/dev/null | tr -s '\n' ' ' | tr -c '[:print:]' '?' | cut -c1-400)
    detail=${detail% }
  fi
  if [ "$answering" = 1 ]; then
    healthy=$((healthy + 1))
    [ -z "$reason" ] || echo "gpufleet-mps-health: the MPS daemon of $pipe answered, but not every answer could be read ($reason)${detail:+: $detail}" >&2
  else
    sick=$((sick + 1))
    echo "gpufleet-mps-health: the MPS daemon of $pipe did not answer within ${timeout_s}s ($reason)${detail:+: $detail}" >&2
  fi
  f_up="${f_up}gpufleet_mps_daemon_up{$labels} $up$nl"
  f_answering="${f_answering}gpufleet_mps_daemon_answering{$labels} $answering$nl"
  for each in @REASONS@; do
    value=0
    [ "$each" = "$reason" ] && value=1
    f_error="${f_error}gpufleet_mps_daemon_error{$labels,reason=\"$each\"} $value$nl"
  done
  [ "$answering" = 1 ] && [ "$ratio" != - ] && f_ratio="${f_ratio}gpufleet_mps_default_active_thread_ratio{$labels} $ratio$nl"
  if [ "$answering" = 1 ] && [ "$complete" = 1 ]; then
    f_servers="${f_servers}gpufleet_mps_servers{$labels} $servers$nl"
    f_clients="${f_clients}gpufleet_mps_clients{$labels} $clients$nl"
    n_container=0 n_slurm_job=0 n_host=0 n_unknown=0
    old_ifs=$IFS
    IFS=,
    for pid in $cpids; do
      case $pid in '' | *[!0-9]*) continue ;; esac
      owner_of "/proc/$pid/cgroup"
      case $owner in
        container) n_container=$((n_container + 1)) ;;
        slurm_job) n_slurm_job=$((n_slurm_job + 1)) ;;
        host) n_host=$((n_host + 1)) ;;
        *) n_unknown=$((n_unknown + 1)) ;;
      esac
    done
    IFS=$old_ifs
    f_owner="${f_owner}gpufleet_mps_clients_by_owner{$labels,owner=\"container\"} $n_container$nl"
    f_owner="${f_owner}gpufleet_mps_clients_by_owner{$labels,owner=\"slurm_job\"} $n_slurm_job$nl"
    f_owner="${f_owner}gpufleet_mps_clients_by_owner{$labels,owner=\"host\"} $n_host$nl"
    f_owner="${f_owner}gpufleet_mps_clients_by_owner{$labels,owner=\"unknown\"} $n_unknown$nl"
    ordinal=0
    rest_devices=$devices
    rest_limits=$limits
    while [ "$ordinal" -lt "$ordinals" ]; do
      device=${rest_devices%%,*}
      rest_devices=${rest_devices#*,}
      limit=${rest_limits%%,*}
      rest_limits=${rest_limits#*,}
      if [ "$limit" != - ]; then
        escape "$device"
        f_limit="${f_limit}gpufleet_mps_default_device_pinned_memory_limit_bytes{$labels,device=\"$ordinal\",uuid=\"$escaped\"} $limit$nl"
      fi
      ordinal=$((ordinal + 1))
    done
  fi
done
if [ "$healthy" -gt 0 ] && [ "$sick" -eq 0 ]; then
  [ -e "$root/.ready" ] || { : > "$root/.ready" && echo "gpufleet-mps-health: $healthy daemon(s) healthy: $root/.ready written"; }
else
  [ ! -e "$root/.ready" ] || { rm -f "$root/.ready" && echo "gpufleet-mps-health: $root/.ready withdrawn ($sick not answering, $healthy healthy)" >&2; }
fi

now=$(date +%s)
uptime_cs
ready=0
[ -e "$root/.ready" ] && ready=1
if [ "$healthy" -gt 0 ] && [ "$sick" -eq 0 ]; then
  success=$now
else  # the last success of an earlier check, kept
  success=$(sed -n 's/^gpufleet_mps_health_check_last_success_timestamp_seconds{.*} \([0-9][0-9]*\)$/\1/p' "$prom" 2>/dev/null | tail -n 1)
fi
if {
  family gpufleet_mps_daemon_up gauge '@HELP_gpufleet_mps_daemon_up@' "$f_up"
  family gpufleet_mps_daemon_answering gauge '@HELP_gpufleet_mps_daemon_answering@' "$f_answering"
  family gpufleet_mps_daemon_error gauge '@HELP_gpufleet_mps_daemon_error@' "$f_error"
  family gpufleet_mps_servers gauge '@HELP_gpufleet_mps_servers@' "$f_servers"
  family gpufleet_mps_clients gauge '@HELP_gpufleet_mps_clients@' "$f_clients"
  family gpufleet_mps_clients_by_owner gauge '@HELP_gpufleet_mps_clients_by_owner@' "$f_owner"
  family gpufleet_mps_default_active_thread_ratio gauge '@HELP_gpufleet_mps_default_active_thread_ratio@' "$f_ratio"
  family gpufleet_mps_default_device_pinned_memory_limit_bytes gauge '@HELP_gpufleet_mps_default_device_pinned_memory_limit_bytes@' "$f_limit"
  family gpufleet_mps_device_info gauge '@HELP_gpufleet_mps_device_info@' "$f_device"
  family gpufleet_mps_ready gauge '@HELP_gpufleet_mps_ready@' "gpufleet_mps_ready{root=\"$root_label\"} $ready$nl"
  family gpufleet_mps_health_check_timestamp_seconds gauge '@HELP_gpufleet_mps_health_check_timestamp_seconds@' \
    "gpufleet_mps_health_check_timestamp_seconds{root=\"$root_label\"} $now$nl"
  if [ -n "$started" ] && [ -n "$cs" ]; then
    family gpufleet_mps_health_check_duration_seconds gauge '@HELP_gpufleet_mps_health_check_duration_seconds@' \
      "gpufleet_mps_health_check_duration_seconds{root=\"$root_label\"} $(((cs - started) / 100)).$(((cs - started) / 10 % 10))$(((cs - started) % 10))$nl"
  fi
  if [ -n "$success" ]; then
    family gpufleet_mps_health_check_last_success_timestamp_seconds gauge '@HELP_gpufleet_mps_health_check_last_success_timestamp_seconds@' \
      "gpufleet_mps_health_check_last_success_timestamp_seconds{root=\"$root_label\"} $success$nl"
  fi
} > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$prom"; then
  exit 0
fi
echo "gpufleet-mps-health: cannot write the metrics for node_exporter to $prom" >&2
exit 1
"""


def label_value(value: str) -> str:
    """``value`` as a label value of Prometheus' text exposition format: backslash, double quote and newline escaped."""
    return value.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def render_metrics_script(root: str, config_dir: str, wants: str, timeout: int, metrics_dir: str, *, v3: bool = False) -> str:
    """The health check that also writes ``<metrics_dir>/gpufleet_mps.prom`` (arguments checked by the caller); ``v3``: a
    resource of the host runs MPS v3 (v3_variants.METRICS_V3)."""
    script = (METRICS_SCRIPT_TEMPLATE.replace('@ROOT_LABEL@', label_value(root)).replace('@ROOT@', root)
              .replace('@CONFIG_DIR@', config_dir).replace('@WANTS_DIR@', wants).replace('@TIMEOUT@', str(int(timeout)))
              .replace('@METRICS_DIR@', metrics_dir).replace('@REASONS@', ' '.join(ERROR_REASONS)))
    for name, (_kind, _labels, text) in METRICS.items():
        script = script.replace('@HELP_%s@' % name, text)
    if v3:
        # Imported here: only a host with a v3 resource compiles it (AnsiballZ compiles what is imported).
        from .v3_variants import METRICS_V3, replaced  # pylint: disable=import-outside-toplevel
        script = replaced(script, METRICS_V3, 'the metrics script')
    return script

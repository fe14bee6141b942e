#!/usr/bin/env bash
# `cmake --install` of a build puts the binary, the example config, the service's config and a
# systemd unit whose paths follow the prefix; the unit passes `systemd-analyze verify` where
# systemd is installed, and the installed binary starts with the installed config.
# Usage: check_install.sh BUILD_DIR
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
fail=0
for f in bin/thermocline share/thermocline/thermocline.example.toml \
         share/thermocline/hardware/rtx3060-12gb.toml etc/thermocline/thermocline.toml \
         lib/systemd/system/thermocline.service share/doc/thermocline/deploy.md; do
  [ -e "$prefix/$f" ] || { echo "missing: $f"; fail=1; }
done
unit="$prefix/lib/systemd/system/thermocline.service"
grep -qx "ExecStart=$prefix/bin/thermocline serve --config $prefix/etc/thermocline/thermocline.toml" \
  "$unit" || { echo "ExecStart does not name the installed binary and config:"; grep ExecStart "$unit"; fail=1; }
if grep -q '@' "$unit"; then echo "unsubstituted @VARIABLE@ in the unit"; fail=1; fi
if command -v systemd-analyze >/dev/null 2>&1; then
  out="$(systemd-analyze verify "$unit" 2>&1 || true)"
  # verify also reports units it cannot reach in a container (e.g. dbus); only the unit counts.
  if echo "$out" | grep -q "thermocline.service:"; then
    echo "systemd-analyze verify: $out"
    fail=1
  fi
fi
# The installed config starts the daemon (no model configured: it serves the admin API).
state="$prefix/state"
sed -e "s|/var/lib/thermocline|$state|g" -e 's|^port = 8080|port = 0|' -e 's|^grpc_port = 50051|grpc_port = -1|' \
  "$prefix/etc/thermocline/thermocline.toml" >"$prefix/test.toml"
"$prefix/bin/thermocline" serve --config "$prefix/test.toml" >"$prefix/out" 2>"$prefix/err" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$prefix/out" && break; sleep 0.1; done
grep -q "listening on http://127.0.0.1:" "$prefix/out" || { echo "the installed daemon did not start:"; cat "$prefix/err"; fail=1; }
kill -TERM "$pid"
wait "$pid" || { echo "the daemon did not stop cleanly"; fail=1; }
[ "$fail" -eq 0 ] && echo "check_install: installed files, unit and config are consistent"
exit "$fail"

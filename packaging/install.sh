#!/bin/bash
# Install or uninstall gpushift the way a distribution installs a daemon.  Called by `make install`
# and `make uninstall` (see the Makefile for the variables); docs/install.md says where each file goes.
#
#   packaging/install.sh install     the build (make build) must be there: $BUILDDIR/wheel/*.whl,
#                                    $BUILDDIR/man/gpushift.1, $BUILDDIR/completions/*
#   packaging/install.sh uninstall   removes what the manifest lists; keeps the state directory
#                                    (the ledger) and edited config unless PURGE=1
#
# Kinds of files:
#   vendor files  (the venv, the command link, gpushift.service, the front door's .socket and .service,
#                  the D-Bus policies, sysusers.d, tmpfiles.d, completions, man page): always replaced,
#                  always removed by uninstall;
#   admin files   (/etc/gpushift/{gpushift.toml,schedule,llama@N.env}, the example backend units in
#                  /etc/systemd/system): installed when absent; updated when nobody edited them since
#                  the last install (their checksum is the one recorded then); an edited one is kept
#                  and the new version goes beside it as NAME.dist.  Uninstall removes an unedited one.
# The manifest, $PREFIX/share/gpushift/manifest, lists every path installed with its kind (and the
# checksum of what was shipped, for admin files); uninstall reads it.
set -euo pipefail
umask 022 # the venv and every file must be readable by group gpushift, whatever root's umask is

SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DESTDIR:-}
D=${D%/}
PREFIX=${PREFIX:-/opt/gpushift}
PREFIX=${PREFIX%/}
BINDIR=${BINDIR:-/usr/local/bin}
SYSCONFDIR=${SYSCONFDIR:-/etc}
DATADIR=${DATADIR:-/usr/share}
BUILDDIR=${BUILDDIR:-$SRC/build}
PYTHON=${PYTHON:-python3}         # the interpreter the venv is made from
BUILD_PYTHON=${BUILD_PYTHON:-}    # a Python with pip, that installs into the venv (pip --python)
PIP_ARGS=${PIP_ARGS:-}            # e.g. --no-index --find-links DIR (offline)
PURGE=${PURGE:-0}

pc_var() { pkg-config --variable="$1" "$2" 2>/dev/null || true; }
if [ -z "${UNITDIR:-}" ]; then
	UNITDIR=$(pc_var systemdsystemunitdir systemd)
	UNITDIR=${UNITDIR:-/usr/lib/systemd/system}
	# Debian 12's systemd.pc still says /lib/systemd/system, which is /usr/lib/systemd/system where
	# /lib links to usr/lib: take the /usr path, so that a DESTDIR tree carries no /lib directory
	# that would replace the link when the tree is unpacked onto such a host.
	case $UNITDIR in /lib/*) if [ "$(readlink -f /lib)" = /usr/lib ]; then UNITDIR=/usr$UNITDIR; fi ;; esac
fi
SYSUSERSDIR=${SYSUSERSDIR:-$(pc_var sysusersdir systemd)}
SYSUSERSDIR=${SYSUSERSDIR:-/usr/lib/sysusers.d}
TMPFILESDIR=${TMPFILESDIR:-$(pc_var tmpfilesdir systemd)}
TMPFILESDIR=${TMPFILESDIR:-/usr/lib/tmpfiles.d}
ADMIN_UNITDIR=$SYSCONFDIR/systemd/system
CONFDIR=$SYSCONFDIR/gpushift
STATEDIR=/var/lib/gpushift # StateDirectory=gpushift
RUNTIMEDIR=/run/gpushift   # RuntimeDirectory=gpushift
MANIFEST_REL=share/gpushift/manifest
# The command path units/gpushift.service names (the default PREFIX); rewritten for another PREFIX.
SHIPPED_COMMAND=/opt/gpushift/bin/gpushift

say() { printf '%s\n' "$*"; }
die() {
	printf 'gpushift install: %s\n' "$*" >&2
	exit 1
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
case $PREFIX in /?*) ;; *) die "PREFIX=$PREFIX: must be an absolute directory of gpushift's own" ;; esac
systemd_runs() { [ -z "$D" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

# gpushift's own units, vendor files: the daemon and the front door (its socket and service).
OWN_UNITS="gpushift.service gpushift-frontdoor.service gpushift-frontdoor.socket"

# The example backend units: every units/*.service but gpushift's own.
backend_units() {
	local u
	for u in "$SRC"/units/*.service; do
		case " $OWN_UNITS " in *" $(basename "$u") "*) ;; *) basename "$u" ;; esac
	done
}

# One of gpushift's own units, its Exec*= command rewritten for $PREFIX; $2: the ExecStart= it must have.
own_unit() {
	local name=$1 want=$2 tmp
	tmp=$(mktemp)
	sed -E "s#^(Exec[A-Za-z]+=[-@:+!]*)$SHIPPED_COMMAND( |\$)#\\1$PREFIX/bin/gpushift\\2#" \
		"$SRC/units/$name" >"$tmp"
	grep -qx "ExecStart=$PREFIX/bin/gpushift $want" "$tmp" ||
		die "units/$name: ExecStart= is not '$SHIPPED_COMMAND $want'"
	vendor_file "$tmp" "$UNITDIR/$name" 0644
	rm -f "$tmp"
}

# ------------------------------------------------------------------ install

NEW_MANIFEST=()
STAGE_DIR= # removed when install stops before moving it into place
cleanup() { if [ -n "$STAGE_DIR" ]; then rm -rf "$STAGE_DIR"; fi; }
trap cleanup EXIT
declare -A OLD_SHA=() OLD_KIND=()

record() { NEW_MANIFEST+=("$1	$2	$3"); } # kind, sha or -, path (without DESTDIR)

# Create the directories above $1 (a path without DESTDIR) that are missing, recording each.
make_parents() {
	local dir missing=() d
	dir=$(dirname "$1")
	while [ "$dir" != / ] && [ ! -d "$D$dir" ]; do
		missing=("$dir" "${missing[@]}")
		dir=$(dirname "$dir")
	done
	for d in "${missing[@]}"; do
		install -d -m 0755 "$D$d"
		record dir - "$d"
	done
}

vendor_file() { # source, destination (without DESTDIR), mode
	make_parents "$2"
	install -m "$3" "$1" "$D$2"
	record file - "$2"
	say "  $2"
}

admin_file() { # source, destination (without DESTDIR)
	local src=$1 dst=$2 new
	new=$(sha "$src")
	make_parents "$dst"
	record conf "$new" "$dst"
	if [ ! -e "$D$dst" ]; then
		install -m 0644 "$src" "$D$dst"
		say "  $dst"
	elif [ "$(sha "$D$dst")" = "$new" ]; then
		say "  $dst (unchanged)"
	elif [ "${OLD_SHA[$dst]:-}" = "$(sha "$D$dst")" ]; then
		install -m 0644 "$src" "$D$dst"
		say "  $dst (updated: nobody had edited it)"
	else
		install -m 0644 "$src" "$D$dst.dist"
		record file - "$dst.dist"
		say "  $dst KEPT: it was edited since the last install; the new version is $dst.dist"
	fi
}

read_manifest() { # file -> OLD_SHA, OLD_KIND; the directories an earlier install made stay recorded
	local kind sum path
	while IFS=$'\t' read -r kind sum path; do
		OLD_KIND[$path]=$kind
		OLD_SHA[$path]=$sum
		if [ "$kind" = dir ] && [ -d "$D$path" ]; then record dir - "$path"; fi
	done <"$1"
}

# The venv is made at $DESTDIR$PREFIX.new and then moved to $DESTDIR$PREFIX, so every path it
# records of itself must be rewritten from the staging path to $PREFIX: pip writes the staging
# interpreter into each script's shebang, venv writes its command line into pyvenv.cfg, and
# compileall writes the source path into each .pyc (recompiled here with -s/-p).  Making the venv
# at its final path inside a private mount namespace was the alternative; it needs root and
# mount namespaces, which a packager building with DESTDIR (fakeroot, a build container) lacks,
# and the same staging serves an upgrade, where the running daemon's venv is swapped only once
# the new one is complete.
build_venv() { # staging dir
	local stage=$1 wheel
	local wheels=("$BUILDDIR"/wheel/gpushift-*.whl)
	[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || die "expected one wheel in $BUILDDIR/wheel (run make build)"
	wheel=${wheels[0]}
	[ -n "$BUILD_PYTHON" ] || die "BUILD_PYTHON (a Python with pip) is not set"
	rm -rf "$stage"
	STAGE_DIR=$stage
	"$PYTHON" -m venv --without-pip "$stage"
	# shellcheck disable=SC2086 # PIP_ARGS is a list of words
	PIP_DISABLE_PIP_VERSION_CHECK=1 "$BUILD_PYTHON" -m pip --python "$stage/bin/python" install -q \
		--no-compile --no-warn-script-location $PIP_ARGS "$wheel"
	"$stage/bin/python" - "$stage" "$PREFIX" <<'EOF'
import glob, os, sys
stage, final = (s.encode() for s in sys.argv[1:3])
# pip records where it took a wheel from (PEP 610's direct_url.json): here the build directory of the
# machine that built it, which means nothing on the host: leave it out, and out of the RECORD.
for direct in glob.glob(os.path.join(sys.argv[1], "lib", "python*", "site-packages", "gpushift-*.dist-info", "direct_url.json")):
    os.unlink(direct)
    record = os.path.join(os.path.dirname(direct), "RECORD")
    with open(record) as f:
        lines = [line for line in f if not line.split(",", 1)[0].endswith("/direct_url.json")]
    with open(record, "w") as f:
        f.writelines(lines)
for top, _dirs, files in os.walk(stage):
    for name in files:
        path = os.path.join(top, name)
        if os.path.islink(path) or name.endswith(b".pyc"):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if stage in data and b"\0" not in data:  # a text file: shebang, pyvenv.cfg, RECORD...
            with open(path, "wb") as f:
                f.write(data.replace(stage, final))
EOF
	"$stage/bin/python" -m compileall -q -j 0 -s "$stage" -p "$PREFIX" "$stage/lib" >/dev/null
	local left
	left=$(grep -rlF -- "$stage" "$stage" || true)
	[ -z "$left" ] || die "the staging path $stage is still named in: $left"
}

do_install() {
	[ -n "$D" ] || [ "$(id -u)" -eq 0 ] || die "make install needs root (or DESTDIR=... for a staged tree)"
	local man=$BUILDDIR/man/gpushift.1 comp=$BUILDDIR/completions
	for f in "$man" "$comp/gpushift.bash" "$comp/_gpushift" "$comp/gpushift.fish"; do
		[ -s "$f" ] || die "$f is missing (run make build)"
	done
	local target=$D$PREFIX stage=$D$PREFIX.new
	if [ -f "$target/$MANIFEST_REL" ]; then
		read_manifest "$target/$MANIFEST_REL"
	elif [ -e "$target" ] && [ -n "$(ls -A "$target")" ]; then
		die "$target exists and is not a gpushift install (no $MANIFEST_REL): choose another PREFIX"
	fi

	say "gpushift: installing into ${D:-/} (PREFIX=$PREFIX)"
	if [ -n "$D" ]; then mkdir -p "$D"; fi
	make_parents "$PREFIX"
	build_venv "$stage"
	local version
	version=$(basename "$BUILDDIR"/wheel/gpushift-*.whl | cut -d- -f2)
	say "  $PREFIX (virtualenv: gpushift $version and its dependencies, from $PYTHON)"
	record venv - "$PREFIX"

	make_parents "$BINDIR/gpushift"
	if [ -e "$D$BINDIR/gpushift" ] && [ ! -L "$D$BINDIR/gpushift" ]; then
		say "  replacing $BINDIR/gpushift (an earlier pip install?) by a link into $PREFIX"
	fi
	ln -sfn "$PREFIX/bin/gpushift" "$D$BINDIR/gpushift"
	record link - "$BINDIR/gpushift"
	say "  $BINDIR/gpushift -> $PREFIX/bin/gpushift"

	# gpushift's own units, running the venv's command.
	own_unit gpushift.service daemon
	own_unit gpushift-frontdoor.service frontdoor
	vendor_file "$SRC/units/gpushift-frontdoor.socket" "$UNITDIR/gpushift-frontdoor.socket" 0644
	local policy
	for policy in org.gpushift.Switcher1.conf org.gpushift.FrontDoor1.conf; do
		vendor_file "$SRC/etc/dbus-1/system.d/$policy" "$DATADIR/dbus-1/system.d/$policy" 0644
	done
	vendor_file "$SRC/etc/sysusers.d/gpushift.conf" "$SYSUSERSDIR/gpushift.conf" 0644
	vendor_file "$SRC/etc/tmpfiles.d/gpushift.conf" "$TMPFILESDIR/gpushift.conf" 0644
	vendor_file "$comp/gpushift.bash" "$DATADIR/bash-completion/completions/gpushift" 0644
	vendor_file "$comp/_gpushift" "$DATADIR/zsh/vendor-completions/_gpushift" 0644
	vendor_file "$comp/gpushift.fish" "$DATADIR/fish/vendor_completions.d/gpushift.fish" 0644
	vendor_file "$man" "$DATADIR/man/man1/gpushift.1" 0644

	local own
	for own in $OWN_UNITS; do
		if [ -e "$D$ADMIN_UNITDIR/$own" ]; then
			say "  NOTE: $ADMIN_UNITDIR/$own overrides $UNITDIR/$own (an earlier"
			say "        make install put it there?): remove it unless you wrote it; use drop-ins instead"
		fi
	done
	admin_file "$SRC/etc/gpushift/gpushift.toml" "$CONFDIR/gpushift.toml"
	admin_file "$SRC/etc/gpushift/schedule" "$CONFDIR/schedule"
	local env # the environment files of the template unit's instances (gpushift-llama@N: llama@N.env)
	for env in "$SRC"/etc/gpushift/*.env; do
		[ -e "$env" ] && admin_file "$env" "$CONFDIR/$(basename "$env")"
	done
	local u
	for u in $(backend_units); do admin_file "$SRC/units/$u" "$ADMIN_UNITDIR/$u"; done

	# What the previous install put there and this one did not: gone.
	local path line
	for path in "${!OLD_KIND[@]}"; do
		case ${OLD_KIND[$path]} in file | link) ;; *) continue ;; esac
		for line in "${NEW_MANIFEST[@]}"; do
			if [ "${line##*$'\t'}" = "$path" ]; then continue 2; fi
		done
		rm -f "$D$path"
		say "  removed $path (no longer installed)"
	done

	mkdir -p "$stage/$(dirname "$MANIFEST_REL")"
	printf '%s\n' "${NEW_MANIFEST[@]}" >"$stage/$MANIFEST_REL"
	if [ -e "$target" ]; then
		rm -rf "$target.old"
		mv "$target" "$target.old"
		mv "$stage" "$target"
		rm -rf "$target.old"
	else
		mv "$stage" "$target"
	fi
	STAGE_DIR=
	say "  $PREFIX/$MANIFEST_REL (what make uninstall removes)"
	post_install
}

post_install() {
	if [ -n "$D" ]; then
		say "DESTDIR is set: systemd-sysusers, systemd-tmpfiles --create and systemctl daemon-reload were"
		say "not run; on the target host run them (in that order) after installing this tree."
		return
	fi
	if command -v systemd-sysusers >/dev/null; then
		systemd-sysusers "$SYSUSERSDIR/gpushift.conf"
		say "systemd-sysusers: group gpushift and user gpushift-frontdoor exist"
	else
		say "systemd-sysusers is missing: create the group and the front door's user yourself"
		say "(groupadd -r gpushift; useradd -r -U -d / -s /usr/sbin/nologin gpushift-frontdoor)"
	fi
	if ! command -v systemd-tmpfiles >/dev/null; then
		say "systemd-tmpfiles is missing: gpushift.service creates $STATEDIR and $RUNTIMEDIR when it starts"
	elif systemd-tmpfiles --create "$TMPFILESDIR/gpushift.conf"; then
		say "systemd-tmpfiles: $STATEDIR and $RUNTIMEDIR are there (0750 root:gpushift)"
	else
		say "systemd-tmpfiles failed: gpushift.service creates $STATEDIR and $RUNTIMEDIR when it starts"
	fi
	if systemd_runs; then
		systemctl daemon-reload
		say "systemctl daemon-reload: done"
		if systemctl is-active --quiet gpushift.service; then
			say "gpushift.service runs the previous version: systemctl restart gpushift"
		fi
		if systemctl is-active --quiet gpushift-frontdoor.service; then
			say "gpushift-frontdoor.service runs the previous version: systemctl restart gpushift-frontdoor"
		fi
	else
		say "systemd is not running here: systemctl daemon-reload skipped"
	fi
	if [ -S /run/dbus/system_bus_socket ] && command -v busctl >/dev/null; then
		if busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ReloadConfig >/dev/null; then
			say "system bus: policy reloaded"
		fi
	fi
	say ""
	say "Next: edit $CONFDIR/gpushift.toml and $CONFDIR/schedule, add who may switch"
	say "(usermod -aG gpushift USER), then:"
	say "  systemctl enable --now gpushift"
	say "  gpushift check"
	say "The front door (one address for every model, docs/frontdoor.md): once the backends listen on"
	say "127.0.0.1:8001 and :8081 (\"Moving an existing host\" there), systemctl enable --now gpushift-frontdoor.socket"
}

# ------------------------------------------------------------------ uninstall

# Remove the directories above a removed path that are now empty: inside a DESTDIR tree all of
# them (the tree is gpushift's), on the live system only those install created (recorded).
prune_parents() {
	[ -n "$D" ] || return 0
	local dir
	dir=$(dirname "$1")
	while [ "$dir" != / ] && rmdir "$D$dir" 2>/dev/null; do dir=$(dirname "$dir"); done
}

do_uninstall() {
	[ -n "$D" ] || [ "$(id -u)" -eq 0 ] || die "make uninstall needs root (or DESTDIR=...)"
	local manifest=$D$PREFIX/$MANIFEST_REL kind sum path removed=() dirs=()
	local unit
	for unit in gpushift-frontdoor.socket gpushift-frontdoor.service gpushift.service; do
		if systemd_runs && systemctl cat "$unit" >/dev/null 2>&1; then
			if systemctl disable --now "$unit"; then say "$unit stopped and disabled"; fi
		fi
	done
	if [ -f "$manifest" ]; then
		say "gpushift: uninstalling from ${D:-/} (PREFIX=$PREFIX)"
		while IFS=$'\t' read -r kind sum path; do
			case $kind in
			file | link)
				rm -f "$D$path"
				removed+=("$path")
				;;
			conf)
				[ -e "$D$path" ] || continue
				if [ "$PURGE" = 1 ] || [ "$(sha "$D$path")" = "$sum" ]; then
					rm -f "$D$path"
					removed+=("$path")
				else
					say "  kept $path: it was edited (make uninstall PURGE=1 removes it)"
				fi
				;;
			dir) dirs+=("$path") ;;
			venv) ;;
			esac
		done <"$manifest"
		rm -rf "$D$PREFIX"
		say "  removed $PREFIX and ${#removed[@]} files"
		removed+=("$PREFIX")
	elif [ "$PURGE" != 1 ]; then
		say "gpushift: nothing installed at $D$PREFIX (no manifest)"
		return 0
	fi
	if [ "$PURGE" = 1 ]; then
		local u p purge=("$CONFDIR" "$STATEDIR" "$RUNTIMEDIR")
		for u in $(backend_units); do purge+=("$ADMIN_UNITDIR/$u" "$ADMIN_UNITDIR/$u.dist"); done
		for p in "${purge[@]}"; do
			if [ -e "$D$p" ]; then
				rm -rf "$D$p"
				removed+=("$p")
				say "  purged $p"
			fi
		done
	else
		say "  kept $STATEDIR (the ledger) and edited config; make uninstall PURGE=1 removes them"
	fi
	local d
	# deepest first: a directory sorts after its parent
	while read -r d; do
		if [ -n "$d" ]; then rmdir "$D$d" 2>/dev/null || true; fi
	done < <(printf '%s\n' "${dirs[@]}" | sort -r)
	for path in "${removed[@]}"; do prune_parents "$path"; done
	if [ -z "$D" ]; then
		if systemd_runs; then
			systemctl daemon-reload
			say "systemctl daemon-reload: done"
		else
			say "systemd is not running here: systemctl daemon-reload skipped"
		fi
		say "The group gpushift and the user gpushift-frontdoor stay (groupdel gpushift; userdel gpushift-frontdoor)."
	fi
}

case ${1:-} in
install) do_install ;;
uninstall) do_uninstall ;;
*) die "usage: $0 install|uninstall" ;;
esac

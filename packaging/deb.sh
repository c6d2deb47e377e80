#!/bin/bash
# Build gpushift_<version>_<arch>.deb with dpkg-deb (`make deb`; docs/install.md, "The Debian
# package", says what is in it and why).
#
# The tree is the one `make install DESTDIR=...` lays out (packaging/install.sh: the virtualenv
# under /opt/gpushift made from the wheel, the vendor units, sysusers.d, tmpfiles.d, the D-Bus
# policy, man page, completions), staged with the package's directories, then made a package:
#
#   * the example backend units go to /usr/share/doc/gpushift/examples (install.sh puts them in
#     /etc/systemd/system for a checkout's admin; a package never enables or places a backend);
#   * every file of the tree's units/ and etc/ must be in the package at its place (see place_of);
#     one install.sh does not lay out yet is added here, so a new unit, D-Bus policy, sysusers.d
#     or tmpfiles.d file is packaged as soon as it lands, and a file of a kind this script does not
#     know fails the build;
#   * install.sh's manifest is left out (dpkg's file list is the package's manifest; make install
#     then refuses to install over the package: "not a gpushift install");
#   * the compiled extensions are stripped (as dh_strip does), the docs Debian asks for are added
#     (copyright, changelog.Debian.gz), and the lintian overrides with their reasons;
#   * DEBIAN/: control (Depends: dpkg-shlibdeps over the venv's ELF files, plus what the venv needs
#     at run time), conffiles (every file under /etc), md5sums and the maintainer scripts of
#     packaging/deb/, whose lists of units and sysusers/tmpfiles files are filled in here.
#
# Variables: BUILDDIR (the build, as make build leaves it), DEB_VERSION (default: the wheel's
# version, "-1"), DEB_OUTDIR (default BUILDDIR), DEB_MAINTAINER (default: the author of the
# checkout's last commit), PYTHON, BUILD_PYTHON and PIP_ARGS (passed to install.sh).
set -euo pipefail
umask 022

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILDDIR=${BUILDDIR:-$SRC/build}
DEB_OUTDIR=${DEB_OUTDIR:-$BUILDDIR}
PYTHON=${PYTHON:-/usr/bin/python3}
PREFIX=/opt/gpushift # the units name /opt/gpushift/bin/gpushift; the package does not move it
UNITDIR=/usr/lib/systemd/system
SYSUSERSDIR=/usr/lib/sysusers.d
TMPFILESDIR=/usr/lib/tmpfiles.d
DBUSDIR=/usr/share/dbus-1/system.d
DOCDIR=/usr/share/doc/gpushift
EXAMPLES=$DOCDIR/examples
SHIPPED_COMMAND=$PREFIX/bin/gpushift

say() { printf '%s\n' "$*"; }
die() {
	printf 'gpushift deb: %s\n' "$*" >&2
	exit 1
}
for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture strip gzip; do
	command -v "$tool" >/dev/null || die "$tool is missing (Debian: apt-get install dpkg-dev binutils)"
done

WORK=$BUILDDIR/deb
ROOT=$WORK/root
rm -rf "$WORK"
mkdir -p "$WORK" "$DEB_OUTDIR"

wheels=("$BUILDDIR"/wheel/gpushift-*.whl)
[ -f "${wheels[0]}" ] || die "no wheel in $BUILDDIR/wheel (run make build)"
PY_VERSION=$(basename "${wheels[0]}" | cut -d- -f2)
# PEP 440 pre-releases sort before the release in Debian only with a tilde: 1.0rc1 -> 1.0~rc1.
DEB_VERSION=${DEB_VERSION:-$(printf '%s' "$PY_VERSION" | sed -E 's/\.?(a|b|rc|dev)([0-9]*)/~\1\2/g')-1}
dpkg --validate-version "$DEB_VERSION" 2>/dev/null || die "DEB_VERSION=$DEB_VERSION is not a Debian version"
ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
DEB_MAINTAINER=${DEB_MAINTAINER:-$(git -C "$SRC" log -1 --format='%an <%ae>' 2>/dev/null || true)}
[ -n "$DEB_MAINTAINER" ] || die "DEB_MAINTAINER (Name <address>) is not set and there is no git history"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$SRC" log -1 --format=%ct 2>/dev/null || date +%s)}

# ------------------------------------------------------------------ the tree make install lays out
say "gpushift deb: staging the tree (packaging/install.sh, PREFIX=$PREFIX)"
DESTDIR=$ROOT PREFIX=$PREFIX BINDIR=/usr/bin UNITDIR=$UNITDIR SYSUSERSDIR=$SYSUSERSDIR \
	TMPFILESDIR=$TMPFILESDIR SYSCONFDIR=/etc DATADIR=/usr/share BUILDDIR=$BUILDDIR PYTHON=$PYTHON \
	BUILD_PYTHON=${BUILD_PYTHON:-} PIP_ARGS=${PIP_ARGS:-} bash "$SRC/packaging/install.sh" install \
	>"$WORK/install.log" || die "packaging/install.sh failed: $WORK/install.log"
rm -f "$ROOT$PREFIX/share/gpushift/manifest"
# ... and the directories venv makes that nothing fills (include/python3.X, share/gpushift)
find "$ROOT$PREFIX" -depth -type d -empty -delete

# Where a file of the tree's units/ or etc/ goes in the package ("" for none known).
place_of() { # path relative to $SRC
	local rel=$1 name
	name=$(basename "$rel")
	case $rel in
	units/*.service)
		if grep -qE "^Exec[A-Za-z]*=[-@:+!]*$SHIPPED_COMMAND( |\$)" "$SRC/$rel"; then
			echo "$UNITDIR/$name" # gpushift's own: runs the venv's command
		else
			echo "$EXAMPLES/$name" # a backend: the admin's, started only by gpushift
		fi
		;;
	units/*) echo "$UNITDIR/$name" ;; # sockets, timers...: gpushift's own
	etc/gpushift/*) echo "/$rel" ;;
	etc/dbus-1/system.d/*.conf) echo "$DBUSDIR/$name" ;;
	etc/sysusers.d/*.conf) echo "$SYSUSERSDIR/$name" ;;
	etc/tmpfiles.d/*.conf) echo "$TMPFILESDIR/$name" ;;
	*) echo "" ;;
	esac
}

# install.sh puts the units it takes for backends where a checkout's admin edits them: in the
# package each goes to its place (the examples; gpushift's own to the vendor directory).
if [ -d "$ROOT/etc/systemd/system" ]; then
	for unit in "$ROOT"/etc/systemd/system/*; do
		dst=$(place_of "units/$(basename "$unit")")
		[ -n "$dst" ] && [ -f "$SRC/units/$(basename "$unit")" ] || die "$unit: not a unit of units/"
		install -D -m 0644 "$unit" "$ROOT$dst"
		rm -f "$unit"
	done
	rmdir "$ROOT/etc/systemd/system" "$ROOT/etc/systemd"
fi
while read -r rel; do
	dst=$(place_of "$rel")
	[ -n "$dst" ] || die "$rel: deb.sh does not know where this kind of file goes (see place_of)"
	if [ ! -e "$ROOT$dst" ]; then
		install -D -m 0644 "$SRC/$rel" "$ROOT$dst"
		say "  $dst (from $rel: install.sh does not lay it out)"
	elif ! cmp -s "$SRC/$rel" "$ROOT$dst"; then
		die "$dst differs from $rel"
	fi
done < <(cd "$SRC" && find units etc -type f | LC_ALL=C sort)

# ------------------------------------------------------------------ what a Debian package adds
# The compiled extensions, stripped of their debugging symbols as dh_strip does.
mapfile -t ELF < <(find "$ROOT$PREFIX" -type f -name '*.so*' -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print | LC_ALL=C sort)
[ ${#ELF[@]} -gt 0 ] || die "no compiled extension in the venv: PyGObject and pycairo have some"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "${ELF[@]}"

install -d "$ROOT$DOCDIR"
"$ROOT$PREFIX/bin/python" -I "$SRC/packaging/deb_copyright.py" "$SRC/LICENSE" >"$ROOT$DOCDIR/copyright"
date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
commit=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "unknown")
printf 'gpushift (%s) unstable; urgency=medium\n\n  * Built from the gpushift sources (commit %s) with make deb.\n\n -- %s  %s\n' \
	"$DEB_VERSION" "$commit" "$DEB_MAINTAINER" "$date" | gzip -9n >"$ROOT$DOCDIR/changelog.Debian.gz"
install -D -m 0644 "$SRC/packaging/deb/lintian-overrides" "$ROOT/usr/share/lintian/overrides/gpushift"
# The compressed man page (Debian policy 12.1); the link to it is what man finds.
gzip -9n "$ROOT/usr/share/man/man1/gpushift.1"
find "$ROOT" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

# ------------------------------------------------------------------ DEBIAN/
CTL=$ROOT/DEBIAN
install -d "$CTL"
mkdir -p "$WORK/shlibs/debian"
printf 'Source: gpushift\n\nPackage: gpushift\nArchitecture: any\n' >"$WORK/shlibs/debian/control"
shlibs=$(cd "$WORK/shlibs" && dpkg-shlibdeps -O "${ELF[@]}") || die "dpkg-shlibdeps failed"
shlibs=${shlibs#shlibs:Depends=}
pyminor=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pynext=$("$PYTHON" -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')
# The venv runs the system python3 of the minor version it was made for (bin/python is a link to
# it, its packages are under lib/python$pyminor); GLib's typelibs for PyGObject and pydbus;
# systemd (sysusers, tmpfiles, the unit) and the system bus the daemon serves on.
depends="python3 (>= $pyminor~), python3 (<< $pynext~), gir1.2-glib-2.0, systemd, dbus, $shlibs"

# Every unit of gpushift's own in the vendor directory, the services among them, and the
# sysusers.d and tmpfiles.d files: what the maintainer scripts act on.
units=$(cd "$ROOT$UNITDIR" && ls | LC_ALL=C sort | tr '\n' ' ')
services=$(cd "$ROOT$UNITDIR" && ls -- *.service | LC_ALL=C sort | tr '\n' ' ')
sysusers=$(cd "$ROOT$SYSUSERSDIR" && ls | LC_ALL=C sort | tr '\n' ' ')
tmpfiles=$(cd "$ROOT$TMPFILESDIR" && ls | LC_ALL=C sort | tr '\n' ' ')
for script in postinst prerm postrm; do
	sed -e "s|@UNITS@|${units% }|" -e "s|@SERVICES@|${services% }|" -e "s|@SYSUSERS@|${sysusers% }|" \
		-e "s|@TMPFILES@|${tmpfiles% }|" "$SRC/packaging/deb/$script" >"$CTL/$script"
	chmod 0755 "$CTL/$script"
	! grep -n '@[A-Z]*@' "$CTL/$script" || die "$script: a placeholder was left"
done
(cd "$ROOT" && find etc -type f | LC_ALL=C sort | sed 's|^|/|') >"$CTL/conffiles"
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$CTL/md5sums"
size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat >"$CTL/control" <<EOF
Package: gpushift
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: $DEB_MAINTAINER
Installed-Size: $size
Depends: $depends
Section: admin
Priority: optional
Description: time-share one GPU host between inference servers
 gpushift switches the GPUs of one host between inference servers (vLLM by
 day, llama.cpp's llama-server by night, or any OpenAI-compatible server) on a
 schedule or on request: it drains the serving backend, stops it, waits until
 the VRAM is released, starts the next one and waits until it answers, and
 records every switch in a hash-chained ledger.
 .
 The package ships the daemon (gpushift.service, not enabled), its command,
 the D-Bus policy, the group gpushift, and example backend units under
 /usr/share/doc/gpushift/examples. gpushift and its Python libraries live in
 a virtualenv under /opt/gpushift.
EOF
find "$ROOT" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

DEB=$DEB_OUTDIR/gpushift_${DEB_VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
say "gpushift deb: $DEB"
say "  Depends: $depends"

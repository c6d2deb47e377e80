"""A :class:`~gpushift.schedule.week.Week` as lines of text: one line per day, the hours across.

The grid is fixed: 3 columns an hour (a cell is 20 minutes of wall-clock time), 72 columns after an
8-column date label, so a line fits 80 columns.  A cell shows the letter of the stretch that begins
in it (the first, when several do: a stretch shorter than a cell still shows where it starts), else
of the stretch in effect at its start:

* the backend's letter (:func:`letters`) in lower case for the weekly entries, in UPPER CASE for a
  calendar exception, an override or a hold; ``-`` for off (``=`` when marked so); ``?`` while
  nothing is in effect (a schedule with no entry fired yet);
* blank for wall-clock times that do not exist (the clock skips them).

Under a day, a line with ``^`` under the cells it is about says what happens there: now, the clock
going forward or back, a calendar exception beginning or ending, an override or hold set or ending.
The characters are the same with and without colour: ``paint(text, style)`` (None: no colour) only
wraps runs of them, so the text stays readable with ``NO_COLOR`` or in a file.  Styles:
``b:NAME`` (``b:NAME!`` marked), ``off`` (``off!``), ``none``, ``gap``, ``note``, ``axis``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gpushift.schedule.week import DAY_S, Day, Stretch, Week

CELL_S = 1200
COLUMNS = DAY_S // CELL_S  # 72
LABEL = 8
WIDTH = LABEL + COLUMNS  # 80

Paint = Callable[[str, str], str]


def letters(backends: Sequence[str]) -> dict[str, str]:
    """One lower-case letter per backend, in order: the first letter of its name not taken yet,
    else the first free letter of the alphabet (``o`` too: off is ``-``)."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in backends:
        if name in out or name == "off":
            continue
        picks = [c for c in name.lower() if "a" <= c <= "z"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
        letter = next((c for c in picks if c not in taken), "#")
        out[name] = letter
        taken.add(letter)
    return out


def _char(s: Stretch | None, marks: dict[str, str]) -> tuple[str, str]:
    if s is None:
        return " ", "gap"
    bang = "!" if s.marked else ""
    if s.backend is None:
        return "?", "none"
    if s.backend == "off":
        return ("=" if s.marked else "-"), "off" + bang
    letter = marks.get(s.backend, "#")
    return (letter.upper() if s.marked else letter), f"b:{s.backend}{bang}"


def cell_stretch(day: Day, k: int) -> int | None:
    """The stretch cell ``k`` of ``day`` shows (its index in the week), None where the clock skips
    every time of the cell."""
    c0, c1 = k * CELL_S, (k + 1) * CELL_S
    begins = [p for p in day.pieces if p.begins and c0 <= p.x0 < c1]
    if begins:
        return min(begins, key=lambda p: (p.x0, p.stretch)).stretch
    for p in day.pieces:
        if p.x0 <= c0 < p.x1:
            return p.stretch
    inside = [p for p in day.pieces if p.x0 < c1 and p.x1 > c0]
    return min(inside, key=lambda p: p.x0).stretch if inside else None


def _hhmm(x: int) -> str:
    return f"{x // 3600:02d}:{x % 3600 // 60:02d}"


def _local(week: Week, u: datetime) -> str:
    lt = u.astimezone(week.tz)
    return f"{lt:%Y-%m-%d %H:%M} {lt.tzname()}"


def _notes(week: Week, i: int) -> list[tuple[int, int, str]]:
    """(first cell, last cell, text) of everything said under day ``i``."""
    day = week.days[i]
    out: list[tuple[int, int, str]] = []
    for s in day.shifts:
        c0, c1 = s.x0 // CELL_S, max(s.x0, s.x1 - 1) // CELL_S
        span = f"{_hhmm(s.x0)}-{_hhmm(s.x1)}"
        if s.kind == "gap":
            out.append((c0, c1, f"{span} skipped: clocks go forward ({s.before_name} to {s.after_name})"))
        else:
            out.append((c0, c1, f"{span} twice: clocks go back ({s.before_name} to {s.after_name})"))

    def at(u: datetime, before: str, after: str = "") -> None:
        where = week.x_of(u)
        if where is not None and where[0] == i:
            c = min(COLUMNS - 1, where[1] // CELL_S)
            out.append((c, c, f"{before} {_hhmm(where[1])}{after}"))

    for sp in week.spans:
        at(sp.start, f"{sp.label} (line {sp.line}) begins")
        at(sp.end, f"{sp.label} ends")
    ov = week.overlay
    if ov is not None:
        at(ov.start, f"{ov.mode} {ov.backend} from")
        if ov.until is not None:
            at(ov.until, "override ends", ", then the schedule")
    if week.now is not None:
        where = week.x_of(week.now)
        if where is not None and where[0] == i:
            c = min(COLUMNS - 1, where[1] // CELL_S)
            lt = week.now.astimezone(week.tz)
            out.append((c, c, f"now {lt:%H:%M} {lt.tzname()}"))
    return sorted(out, key=lambda n: (n[0], n[1]))


def _note_line(c0: int, c1: int, text: str, paint: Paint | None) -> str:
    marks = "^" * (c1 - c0 + 1)
    right = LABEL + c1 + 2 + len(text) <= WIDTH
    left_room = LABEL + c0 - len(text) - 1
    if right or left_room < 0:
        line = " " * (LABEL + c0) + marks + " " + text
        return _painted(line, "note", paint)
    return _painted(" " * left_room + text + " " + marks, "note", paint)


def _painted(text: str, style: str, paint: Paint | None) -> str:
    if paint is None or not text.strip():
        return text
    lead = len(text) - len(text.lstrip())
    return text[:lead] + paint(text[lead:], style)


def _row(week: Week, day: Day, marks: dict[str, str], paint: Paint | None) -> str:
    label = f"{day.date:%a} {day.date.day:>2}".ljust(LABEL)
    runs: list[tuple[str, str]] = []
    for k in range(COLUMNS):
        idx = cell_stretch(day, k)
        ch, style = _char(week.stretches[idx] if idx is not None else None, marks)
        if runs and runs[-1][1] == style and paint is not None:
            runs[-1] = (runs[-1][0] + ch, style)
        else:
            runs.append((ch, style))
    if paint is None:
        return (label + "".join(ch for ch, _ in runs)).rstrip()
    return (label + "".join(paint(t, st) if st != "gap" else t for t, st in runs)).rstrip()


def _legend(week: Week, marks: dict[str, str], paint: Paint | None) -> list[str]:
    shown = [b for b in marks if any(s.backend == b for s in week.stretches)] or list(marks)
    parts = [f"{_painted(marks[b], f'b:{b}', paint)} {b}" for b in shown]
    parts.append(f"{_painted('-', 'off', paint)} off")
    lines: list[str] = []
    line = ""
    for p in parts:  # wrapped at the width (a long list of backends)
        if line and len(line) + 3 + len(p) > WIDTH:
            lines.append(line)
            line = ""
        line += ("   " if line else "  ") + p
    lines.append(line)
    lines.append("  UPPER CASE and =: a calendar exception, an override or a hold")
    if any(d.gaps for d in week.days):
        lines.append("  blank: wall-clock times the clock skips")
    if any(s.backend is None for s in week.stretches):
        lines.append("  ?: nothing in effect (no entry has fired yet)")
    return lines


def render(week: Week, marks: dict[str, str], paint: Paint | None = None) -> list[str]:
    """The grid: the hour axis, a line per day with its notes, the legend, the calendar
    exceptions of these days and the override or hold laid over them."""
    axis = (" " * LABEL + "".join(f"{h:02d}    " for h in range(0, 24, 2))).rstrip()
    out = [_painted(axis, "axis", paint)]
    for i, day in enumerate(week.days):
        out.append(_row(week, day, marks, paint))
        out += [_note_line(c0, c1, text, paint) for c0, c1, text in _notes(week, i)]
    out.append("")
    out += _legend(week, marks, paint)
    if week.spans:
        out.append("  calendar exceptions:")
    for sp in week.spans:
        out.append(
            f"    {sp.label} (line {sp.line}): {sp.target}, {_local(week, sp.start)} to {_local(week, sp.end)}"
        )
    ov = week.overlay
    if ov is not None:
        until = f"until {_local(week, ov.until)}" if ov.until is not None else "until `gpushift resume`"
        out.append(f"  {ov.mode} in effect: {ov.backend} {until}")
    return out

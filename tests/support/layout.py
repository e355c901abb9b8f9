"""Layout as Chromium draws it, measured in the page (bounding boxes, scroll widths): what
scrolls sideways, what sticks out of the viewport, where an element is. For the browser
tests of the admin at a phone's and a desktop's width."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Locator, Page

# Elements of the content that scroll sideways inside the page, and visible elements that
# stick out of the viewport on either side.
_SIDEWAYS = """() => {
    const width = document.documentElement.clientWidth;
    const out = [];
    const name = (e) => {
        const cls = typeof e.className === 'string' ? e.className.trim() : '';
        return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
            + (cls ? '.' + cls.split(/\\s+/).join('.') : '');
    };
    for (const e of document.querySelectorAll('#content *')) {
        const s = getComputedStyle(e);
        if (s.display === 'none' || s.visibility === 'hidden') continue;
        const scrolls = ['auto', 'scroll'].includes(s.overflowX);
        if (scrolls && e.scrollWidth > e.clientWidth + 1
                && !['TEXTAREA', 'SELECT'].includes(e.tagName)) {
            out.push(`${name(e)} scrolls ${e.scrollWidth - e.clientWidth}px sideways`);
        }
        const r = e.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        if (r.right > width + 1 || r.left < -1) {
            const at = `${Math.round(r.left)}..${Math.round(r.right)}`;
            out.push(`${name(e)} spans ${at} of ${width}`);
        }
    }
    return out;
}"""

# For each row of a change list, the cells of the given columns that are missing or lie
# outside the viewport (as do any link or button in them).
_CELLS = """(classes) => {
    const width = document.documentElement.clientWidth;
    const rows = [...document.querySelectorAll('#result_list tbody tr')];
    const out = {rows: rows.length, problems: []};
    const outside = (r) => r.left < -1 || r.right > width + 1;
    const at = (r) => `${Math.round(r.left)}..${Math.round(r.right)} of ${width}`;
    rows.forEach((row, i) => {
        for (const c of classes) {
            const cell = row.querySelector('.field-' + c);
            if (!cell) {
                out.problems.push(`row ${i + 1}: no ${c}`);
                continue;
            }
            const r = cell.getBoundingClientRect();
            if (r.width === 0 || r.height === 0 || outside(r)) {
                out.problems.push(`row ${i + 1}: ${c} at ${at(r)}`);
            }
            for (const b of cell.querySelectorAll('a, button')) {
                const q = b.getBoundingClientRect();
                if (q.width > 0 && outside(q)) {
                    out.problems.push(`row ${i + 1}: ${c}'s ${b.textContent.trim()} at ${at(q)}`);
                }
            }
        }
    });
    return out;
}"""


def width_of(page: Page) -> int:
    return page.viewport_size["width"] if page.viewport_size else 0


def sideways(page: Page, what: str) -> list[str]:
    """What scrolls sideways on the page, or sticks out of it: nothing, when it fits."""
    scroll, inner = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    problems = [f"the page scrolls sideways ({scroll} > {inner})"] if scroll > inner else []
    problems += page.evaluate(_SIDEWAYS)
    return [f"{what} at {inner} px: {p}" for p in problems[:6]]


def cells_off_screen(page: Page, what: str, classes: tuple[str, ...]) -> list[str]:
    """Which of a change list's cells of ``classes`` (``.field-<name>``) are missing from a
    row, or lie outside the viewport (nothing, when every row shows them all)."""
    found: dict[str, Any] = page.evaluate(_CELLS, list(classes))
    assert found["rows"] > 0, f"{what}: the list is empty"
    return [f"{what} at {width_of(page)} px: {p}" for p in found["problems"][:6]]


def box(locator: Locator) -> dict[str, float]:
    """``locator``'s box in the viewport (CSS pixels): top, bottom, left, right."""
    found: dict[str, float] = locator.evaluate(
        "(e) => { const r = e.getBoundingClientRect();"
        " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }"
    )
    return found


def in_view(page: Page, locator: Locator) -> bool:
    """Whether all of ``locator``'s box is inside the viewport (what a person sees now)."""
    r = box(locator)
    size = page.viewport_size or {"width": 0, "height": 0}
    return (
        r["top"] >= -1
        and r["left"] >= -1
        and r["bottom"] <= size["height"] + 1
        and r["right"] <= size["width"] + 1
        and r["bottom"] > r["top"]
    )

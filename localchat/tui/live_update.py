"""An open list, table or heading brought up to date in place, so a frame mounts what is new.

Rebuilding an open list each frame re-mounted every item (Textual styles and composes each new
widget: ~1 ms apiece) and laid the screen out again; here the items already shown stay, the
item being written takes its new text, and only a new item is mounted. A table's row being
written takes its new cell texts and a new row mounts its cells; a heading or a paragraph
inside an item takes its new text. Text that keeps its height repaints without a layout.

``update_in_place(live, new)`` makes the mounted ``live`` show the freshly parsed ``new`` and says
whether it could; if not, the caller replaces ``live`` with ``new``.
"""

from __future__ import annotations

from textual.containers import Horizontal
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets._markdown import (
    MarkdownBlock,
    MarkdownBullet,
    MarkdownFence,
    MarkdownList,
    MarkdownTable,
    MarkdownTableCellContents,
    MarkdownTableContent,
)


async def update_in_place(live: Widget, new: Widget) -> bool:
    """Make ``live`` (mounted) show what ``new`` (parsed, not mounted) holds, if it can."""
    if type(live) is not type(new) or live.parent is None:
        return False
    if not isinstance(live, MarkdownBlock) or not isinstance(new, MarkdownBlock):
        return False
    if isinstance(live, MarkdownList) and isinstance(new, MarkdownList):
        return await _extend_list(live, new)
    if isinstance(live, MarkdownTable) and isinstance(new, MarkdownTable):
        return await _extend_table(live, new)
    if isinstance(live, MarkdownFence):
        await live._update_from_block(new)
        return True
    if not new._blocks and not live.children:  # a heading, a paragraph, a rule: text only
        live._copy_context(new)
        live._content = new._content
        set_text(live, new._content)
        return True
    return False


def set_text(widget: Static, content: Content) -> None:
    """Show ``content`` in ``widget``, laying out only if its height changes."""
    width, height = widget.content_size
    same = bool(width) and content.get_height(widget.styles, width) == height  # type: ignore[arg-type]
    widget.update(content, layout=not same)


async def _extend_table(live: MarkdownTable, new: MarkdownTable) -> bool:
    """The last row shown takes its cells' new text; rows after it are mounted."""
    tables = live.query(MarkdownTableContent)
    if not tables:
        return False
    table = tables.first()
    headers, rows = new._get_headers_and_rows()
    if not table.rows or len(rows) < len(table.rows) or [h.plain for h in headers] != [h.plain for h in table.headers]:
        return False
    last = len(table.rows)
    for cell, text in zip(table.query_children(f".row{last}").results(Static), rows[last - 1]):
        shown = cell.visual
        if not isinstance(shown, Content) or (shown.plain, shown.spans) != (text.plain, text.spans):
            # A cell keeps its column's width unless its text outgrows it.
            cell.update(text, layout=text.cell_length > cell.content_size.width or "\n" in text.plain)
    cells = [MarkdownTableCellContents(text, classes=f"row{index} cell", name=f"cell{index}.{column}")
             for index, row in enumerate(rows[last:], last + 1) for column, text in enumerate(row, 1)]
    if cells:
        await table.mount_all(cells)
    table.rows = rows
    table.last_row = len(rows)
    live._headers, live._rows = headers, rows
    return True


async def _extend_list(live: MarkdownList, new: MarkdownList) -> bool:
    """Items shown stay; the last one shown is updated (or replaced), new ones are mounted."""
    old_items = [child for child in live.children if isinstance(child, Horizontal)]
    new_items = [item for item in new.compose() if isinstance(item, Horizontal)]
    if not old_items or len(new_items) < len(old_items):
        return False
    if any(_symbol(old) != _symbol(fresh) for old, fresh in zip(old_items, new_items)):
        return False  # the numbers were re-justified (a tenth item), say
    last, fresh = old_items[-1], new_items[len(old_items) - 1]
    if not await _update_item(last, fresh):
        await live.mount(fresh, after=last)
        await last.remove()
    if len(new_items) > len(old_items):
        await live.mount_all(new_items[len(old_items):])
    return True


async def _update_item(old: Horizontal, fresh: Horizontal) -> bool:
    old_body = old.children[-1]
    fresh_body = _pending(fresh)[-1]
    old_blocks, new_blocks = list(old_body.children), _pending(fresh_body)
    if len(old_blocks) != len(new_blocks):
        return False
    for old_block, new_block in zip(old_blocks, new_blocks):
        if not await update_in_place(old_block, new_block):
            return False
    return True


def _symbol(item: Widget) -> str:
    bullets = [w for w in (item.children if item.is_mounted else _pending(item)) if isinstance(w, MarkdownBullet)]
    return bullets[0].symbol if bullets else ""


def _pending(widget: Widget) -> list[Widget]:
    """The children a composed, not yet mounted container will mount (Textual keeps them)."""
    return list(getattr(widget, "_pending_children", []))

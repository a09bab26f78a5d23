"""An open list, table or heading brought up to date in place, so a frame builds what is new.

Rebuilding an open list each frame re-mounted every item (Textual styles and composes each new
widget) and building its widgets from the parse, even to throw them away, cost ~0.5 ms a widget
(a 4-row table is ~25): here the text of what is shown comes straight from markdown-it's
tokens. The items already shown stay, the item being written takes its new text, and only a new
item is built and mounted; a table's row being written takes its new cell texts and a new row
mounts its cells; a heading takes its new text. Text that keeps its height repaints without a
layout.

``update_from_tokens(live, tokens, build)`` makes the mounted block ``live`` show the open block
whose markdown-it ``tokens`` are given, and says whether it could (if not, the caller replaces
``live`` with ``build()``'s widgets). ``build`` is called only when new widgets are needed.
"""

from __future__ import annotations

from collections.abc import Callable

from markdown_it.token import Token
from textual.containers import Horizontal
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets._markdown import (
    MarkdownBlock,
    MarkdownBullet,
    MarkdownBulletList,
    MarkdownHeader,
    MarkdownList,
    MarkdownOrderedList,
    MarkdownParagraph,
    MarkdownTable,
    MarkdownTableCellContents,
    MarkdownTableContent,
)

_LISTS = {"bullet_list_open": MarkdownBulletList, "ordered_list_open": MarkdownOrderedList}


async def update_from_tokens(live: Widget, tokens: list[Token],
                             build: Callable[[], list[MarkdownBlock]]) -> bool:
    """Make ``live`` (mounted) show the block of ``tokens``, if it can."""
    if not tokens or live.parent is None or not isinstance(live, MarkdownBlock):
        return False
    first = tokens[0]
    if first.type == "heading_open" and isinstance(live, MarkdownHeader) and live.name == first.type \
            and live._token.tag == first.tag and len(tokens) > 1:
        set_text(live, live._token_to_content(tokens[1]))
        return True
    if first.type == "table_open" and isinstance(live, MarkdownTable):
        headers, rows = _table(live, tokens)
        return await _extend_table(live, headers, rows)
    kind = _LISTS.get(first.type)
    if kind is not None and type(live) is kind:
        return await _extend_list(live, tokens, build)
    return False


def set_text(widget: Static, content: Content) -> None:
    """Show ``content`` in ``widget``, laying out only if its height changes."""
    width, height = widget.content_size
    same = bool(width) and content.get_height(widget.styles, width) == height  # type: ignore[arg-type]
    if isinstance(widget, MarkdownBlock):
        widget._content = content
    widget.update(content, layout=not same)


def _table(block: MarkdownBlock, tokens: list[Token]) -> tuple[list[Content], list[list[Content]]]:
    """Header and row texts, as Textual's MarkdownTable makes them (a last empty row dropped)."""
    headers: list[Content] = []
    rows: list[list[Content]] = []
    cell = ""
    for token in tokens:
        if token.type in ("th_open", "td_open"):
            cell = token.type
        elif token.type == "inline" and cell:
            (headers if cell == "th_open" else rows[-1]).append(block._token_to_content(token))
            cell = ""
        elif token.type == "tr_open" and headers:
            rows.append([])
    if rows and not rows[-1]:
        rows.pop()
    return headers, rows


async def _extend_table(live: MarkdownTable, headers: list[Content], rows: list[list[Content]]) -> bool:
    """The last row shown takes its cells' new text; rows after it are mounted."""
    tables = live.query(MarkdownTableContent)
    if not tables:
        return False
    table = tables.first()
    if not table.rows or len(rows) < len(table.rows) or [h.plain for h in headers] != [h.plain for h in table.headers]:
        return False  # not yet a table with a row to start from, or a different one
    last = len(table.rows)
    for cell, text in zip(table.query_children(f".row{last}").results(Static), rows[last - 1]):
        shown = cell.visual
        if not isinstance(shown, Content) or (shown.plain, shown.spans) != (text.plain, text.spans):
            # A cell keeps its column's width unless its text outgrows it.
            cell.update(text, layout=text.cell_length > cell.content_size.width or "\n" in text.plain)
    cells = [MarkdownTableCellContents(text, classes=f"row{index} cell", name=f"cell{index}.{column}")
             .with_tooltip(text.plain)
             for index, row in enumerate(rows[last:], last + 1) for column, text in enumerate(row, 1)]
    if cells:
        await table.mount_all(cells)
    table.rows = rows
    table.last_row = len(rows)
    live._headers, live._rows = headers, rows
    return True


async def _extend_list(live: MarkdownList, tokens: list[Token], build: Callable[[], list[MarkdownBlock]]) -> bool:
    """Items shown stay; the last one shown takes its new text (or is replaced), new ones are
    mounted."""
    old_items = [child for child in live.children if isinstance(child, Horizontal)]
    items = _items(tokens)
    if not old_items or len(items) < len(old_items):
        return False
    if len(items) == len(old_items) and _set_item_text(live, old_items[-1], items[-1]):
        return True
    fresh = build()
    if len(fresh) != 1 or type(fresh[0]) is not type(live):
        return False
    new_items = [item for item in fresh[0].compose() if isinstance(item, Horizontal)]
    if len(new_items) != len(items) or any(_symbol(old) != _symbol(new) for old, new in zip(old_items, new_items)):
        return False  # the numbers were re-justified (a tenth item), say
    last, replacement = old_items[-1], new_items[len(old_items) - 1]
    await live.mount(replacement, after=last)
    await last.remove()
    if len(new_items) > len(old_items):
        await live.mount_all(new_items[len(old_items):])
    return True


def _items(tokens: list[Token]) -> list[list[Token]]:
    """The tokens of each item of the list that ``tokens`` open."""
    items: list[list[Token]] = []
    level = tokens[0].level + 1
    for token in tokens[1:]:
        if token.type == "list_item_open" and token.level == level:
            items.append([])
        elif items:
            items[-1].append(token)
    return items


def _set_item_text(live: MarkdownList, item: Horizontal, tokens: list[Token]) -> bool:
    """An item that is one paragraph, shown as one: its text updated; False for anything else."""
    body = item.children[-1]
    blocks = list(body.children)
    inline = [t for t in tokens if t.type == "inline"]
    shape = [t.type for t in tokens if t.type.endswith("_open")]
    if shape != ["paragraph_open"] or len(inline) != 1 or len(blocks) != 1 \
            or not isinstance(blocks[0], MarkdownParagraph):
        return False
    set_text(blocks[0], live._token_to_content(inline[0]))
    return True


def _symbol(item: Widget) -> str:
    children = item.children if item.is_mounted else getattr(item, "_pending_children", [])
    bullets = [w for w in children if isinstance(w, MarkdownBullet)]
    return bullets[0].symbol if bullets else ""

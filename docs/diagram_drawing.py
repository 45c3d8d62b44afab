"""Plain-SVG drawing for docs/diagrams.py: boxes, arrows and labels, nothing to install.

Each diagram is its own light card (dark ink on white), so it reads the same on the site's light
and dark palettes and on GitHub. Text is monospace, so its width is known without a font: a
label is wrapped to the room it has. The output depends only on the data: the same data draws
the same bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

FONT = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
SIZE = 12                       # px
CHAR = 7.3                      # px per character at SIZE: DejaVu Sans Mono's 0.602 em, rounded up
LINE = 15                       # px between lines
WIDTH = 680                     # px: the content column of the site at 1280 px, so 1:1 there
INK, MUTED, STROKE, PAPER, BORDER, ACCENT = "#1f2328", "#57606a", "#4a5568", "#ffffff", "#d0d7de", "#3949ab"
SIDE_COLORS = [("#e8eaf6", "#3949ab"), ("#e6f4ea", "#2e7d32"), ("#fff4e5", "#b45309"), ("#eef1f4", "#546e7a")]


@dataclass
class Layers:
    """The package's layers, top to bottom, as the layer diagram shows them."""

    rows: list[list[str]]                                   # each row: independent layers side by side
    side: dict[str, str] = field(default_factory=dict)      # layer -> its process side
    modules: dict[str, int] = field(default_factory=dict)   # layer -> how many modules it holds
    imports: dict[tuple[str, str], int] = field(default_factory=dict)  # (a, b) -> modules of a importing b


@dataclass
class Call:
    """A call from one participant to another (or to itself), drawn as a solid arrow."""

    src: str
    dst: str
    text: str


class Reply(Call):
    """An answer, drawn as a dashed arrow."""


@dataclass
class Loop:
    """Steps repeated, framed and labelled."""

    label: str
    steps: list[Call]


@dataclass
class Sequence:
    """A sequence diagram: participants (id -> label), left to right, and the steps top to bottom."""

    participants: dict[str, str]
    steps: list[Call | Loop]


@dataclass
class Flow:
    """A flowchart: rows of nodes (id -> text), top to bottom; edges (src, dst[, label]) go to the next row."""

    rows: list[dict[str, str]]
    edges: list[tuple[str, ...]]


@dataclass
class Chains:
    """Panels, each a title over a chain of steps drawn left to right."""

    panels: list[tuple[str, list[str]]]


def wrap(text: str, chars: int) -> list[str]:
    """``text`` in lines of at most ``chars`` characters: at its line breaks and spaces, a longer word after
    its last ``/`` or ``,`` that fits, else where it must."""
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            while len(word) > chars:
                cut = max(word.rfind("/", 0, chars) + 1, word.rfind(",", 0, chars) + 1) or chars
                if line:
                    lines.append(line)
                    line = ""
                lines.append(word[:cut])
                word = word[cut:]
            if line and len(line) + 1 + len(word) > chars:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


class Canvas:
    """SVG elements collected in drawing order; ``svg(height)`` closes the document."""

    def __init__(self, title: str, width: float = WIDTH) -> None:
        self.width, self.title, self.items, self.colors = width, title, [], [STROKE]

    def rect(self, x: float, y: float, w: float, h: float, fill: str = PAPER, stroke: str = ACCENT,
             rx: float = 6, width: float = 1.5) -> None:
        self.items.append(f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" rx="{num(rx)}" '
                          f'fill="{fill}" stroke="{stroke}" stroke-width="{num(width)}"/>')

    def text(self, lines: list[str], x: float, y: float, anchor: str = "start", color: str = INK,
             bold: bool = False, size: int = SIZE, backdrop: bool = False) -> None:
        """Lines from baseline ``y`` down; ``backdrop`` hides what lies under them."""
        if backdrop:
            w = max(map(len, lines)) * CHAR * size / SIZE + 6
            left = {"start": x - 3, "middle": x - w / 2, "end": x - w + 3}[anchor]
            self.items.append(f'<rect x="{num(left)}" y="{num(y - size)}" width="{num(w)}" '
                              f'height="{num(LINE * (len(lines) - 1) + size + 5)}" fill="{PAPER}" opacity="0.92"/>')
        attrs = f'x="{num(x)}" y="{num(y)}" fill="{color}" text-anchor="{anchor}"'
        attrs += ' font-weight="bold"' * bold + f' font-size="{size}"' * (size != SIZE)
        spans = "".join(f'<tspan x="{num(x)}" dy="{LINE if i else 0}">{escape(line)}</tspan>' for i, line in enumerate(lines))
        self.items.append(f"<text {attrs} xml:space=\"preserve\">{spans}</text>")

    def path(self, d: str, dashed: bool = False, arrow: bool = True, color: str = STROKE) -> None:
        if arrow and color not in self.colors:
            self.colors.append(color)
        extra = ' stroke-dasharray="5 4"' * dashed
        if arrow:
            extra += f' marker-end="url(#arrow{self.colors.index(color)})"'
        self.items.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.4"{extra}/>')

    def svg(self, height: float) -> str:
        w, h = num(self.width), num(height)
        head = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'font-family={quoteattr(FONT)} font-size="{SIZE}">',
            f"<title>{escape(self.title)}</title>",
            "<defs>" + "".join(
                f'<marker id="arrow{i}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                f'markerUnits="userSpaceOnUse" orient="auto"><path d="M0,1 L10,5 L0,9 z" fill="{color}"/></marker>'
                for i, color in enumerate(self.colors)) + "</defs>",
            f'<rect x="0.5" y="0.5" width="{num(self.width - 1)}" height="{num(height - 1)}" rx="8" '
            f'fill="{PAPER}" stroke="{BORDER}"/>',
        ]
        return "\n".join(head + self.items + ["</svg>"]) + "\n"


def box(canvas: Canvas, text: str, x: float, y: float, w: float, h: float) -> None:
    """A node at ``(x, y)``, ``w`` by ``h``, its ``text`` wrapped to its width and centred."""
    lines = wrap(text, int((w - 14) / CHAR))
    canvas.rect(x, y, w, h)
    canvas.text(lines, x + w / 2, y + (h - len(lines) * LINE) / 2 + SIZE - 1, anchor="middle")


def text_width(lines: list[str]) -> float:
    return max(map(len, lines)) * CHAR


def fit(natural: list[float], room: float) -> list[float]:
    """Widths that fill ``room``: the spare shared equally, or a shortfall taken from the widest first."""
    if sum(natural) <= room:
        return [w + (room - sum(natural)) / len(natural) for w in natural]
    cap, rest = room / len(natural), sorted(natural)
    for i, w in enumerate(rest):                          # the largest cap under which the narrow ones keep their width
        if w > (room - sum(rest[:i])) / (len(rest) - i):
            cap = (room - sum(rest[:i])) / (len(rest) - i)
            break
    return [min(w, cap) for w in natural]


# --- the layers: a tower of boxes in bands by process side, imports as arcs beside it -----------

def _arc_reach(span: int) -> float:
    return 20 + 26 * span                                   # control offset; the arc bulges 3/4 of it


def draw_layers(layers: Layers, sides: tuple[str, ...], title: str) -> str:
    margin, label_w, box_w, box_h, pitch = 16, 108, 240, 50, 76
    level = {name: i for i, row in enumerate(layers.rows) for name in row}
    left_of = {row[0] for row in layers.rows if len(row) == 2}
    if any(len(row) > 2 for row in layers.rows):
        raise ValueError(f"the layer diagram draws at most two independent layers side by side: {layers.rows}")
    side_of_edge = {edge: "left" if set(edge) & left_of else "right" for edge in layers.imports}
    reach = {s: max([_arc_reach(level[b] - level[a]) * 0.75 for (a, b), e in side_of_edge.items() if e == s], default=0)
             for s in ("left", "right")}
    col = margin + label_w + reach["left"] + 14
    canvas = Canvas(title, width=col + box_w + reach["right"] + 14 + margin)
    top = margin + 10
    boxes = {}
    for i, row in enumerate(layers.rows):
        w = box_w if len(row) == 1 else (box_w - 16) / 2
        for j, name in enumerate(row):
            boxes[name] = (col + j * (w + 16), top + i * pitch, w)
    for k, side in enumerate(sides):
        rows = sorted({level[n] for n, s in layers.side.items() if s == side})
        if not rows:
            continue
        y0, y1 = top + rows[0] * pitch - 11, top + rows[-1] * pitch + box_h + 11
        tint, color = SIDE_COLORS[k % len(SIDE_COLORS)]
        canvas.rect(margin, y0, canvas.width - 2 * margin, y1 - y0, fill=tint, stroke=tint, rx=8)
        lines = wrap(side, int((label_w - 16) / CHAR))
        canvas.text(lines, margin + 10, (y0 + y1) / 2 - (len(lines) - 1) * LINE / 2 + 4, color=color, bold=True)
    ports: dict[tuple[str, str], list[tuple[tuple[str, str], tuple[int, int]]]] = {}
    for (a, b), s in side_of_edge.items():     # arrivals above departures; nearest source, farthest target first: arcs nest
        ports.setdefault((b, s), []).append(((a, b), (0, level[b] - level[a])))
        ports.setdefault((a, s), []).append(((a, b), (1, level[a] - level[b])))
    at = {}
    for (name, s), edges in ports.items():
        x, y, w = boxes[name]
        for i, (edge, _) in enumerate(sorted(edges, key=lambda e: e[1])):
            at[edge, name] = (x if s == "left" else x + w, y + box_h * (i + 1) / (len(edges) + 1))
    color = {name: SIDE_COLORS[sides.index(side) % len(SIDE_COLORS)][1] for name, side in layers.side.items()}
    for name, (x, y, w) in boxes.items():
        canvas.rect(x, y, w, box_h, stroke=color[name])
        canvas.text([name], x + w / 2, y + 21, anchor="middle", bold=True)
        count = layers.modules.get(name, 0)
        canvas.text([f"{count} module{'s' * (count != 1)}"], x + w / 2, y + 38, anchor="middle", color=MUTED, size=11)
    for (a, b), s in side_of_edge.items():
        (x0, y0), (x1, y1) = at[(a, b), a], at[(a, b), b]
        c = _arc_reach(level[b] - level[a]) * (-1 if s == "left" else 1)
        canvas.path(f"M{num(x0)},{num(y0)} C{num(x0 + c)},{num(y0)} {num(x1 + c)},{num(y1)} {num(x1)},{num(y1)}", color=color[a])
    y = top + len(layers.rows) * pitch + 6
    legend = wrap("an arrow: a layer's modules import from the lower layer (found in the source)\n"
                  "side by side: independent layers, importing nothing of each other", int((canvas.width - 2 * margin) / CHAR))
    canvas.text(legend, margin, y + SIZE, color=MUTED)
    return canvas.svg(y + len(legend) * LINE + margin)


# --- a sequence: participants across, steps down ------------------------------------------------

def draw_sequence(seq: Sequence, title: str) -> str:
    margin, gap, canvas = 12, 10, Canvas(title)
    ids, room = list(seq.participants), canvas.width - 2 * margin
    col = room / len(ids)
    parts = [part for label in seq.participants.values() for part in re.split(r"(?<=[/ ])", label)]
    stagger = max(len(part.strip()) for part in parts) > (col - gap - 12) / CHAR   # headers on two rows, twice as wide
    for _ in range(3):                                    # the outer headers' widths set the lifelines' spacing
        heads = {p: wrap(label, int(((1 + stagger) * col - gap - 12) / CHAR)) for p, label in seq.participants.items()}
        widths = {p: min(text_width(lines) + 16, (1 + stagger) * col - gap) for p, lines in heads.items()}
        first, last = widths[ids[0]] / 2, widths[ids[-1]] / 2
        col = (room - first - last) / max(len(ids) - 1, 1)
    cx = {p: margin + first + col * i for i, p in enumerate(ids)}
    rows = [ids[0::2], ids[1::2]] if stagger else [ids]
    head_h = [max(len(heads[p]) for p in row) * LINE + 12 for row in rows]
    head_y = [margin + sum(head_h[:i]) + 8 * i for i in range(len(rows))]
    y = head_y[-1] + head_h[-1] + 18
    body: list[tuple] = []                                # drawn after the lifelines, over them

    def steps(items: list[Call | Loop], y: float, spans: list[tuple[float, float]]) -> float:
        for step in items:
            if isinstance(step, Loop):
                label, inner = ["loop: " + step.label], []
                top = y
                y = steps(step.steps, y + LINE + 12, inner) + 4
                right = min(max(r for _, r in inner) + 12, canvas.width - margin)
                left = max(min(min(s for s, _ in inner) - 12, right - text_width(label) - 14), margin)
                body.append(("text", label, left + 7, top + SIZE + 3))
                body.append(("frame", left, top, right - left, y - top))
                spans.append((left, right))
                y += 14
                continue
            x0, x1 = cx[step.src], cx[step.dst]
            lo, hi = min(x0, x1), max(x0, x1)
            after = wrap(step.text, min(int((canvas.width - margin - lo - 12) / CHAR), 60))
            before = wrap(step.text, min(int((hi - margin - 12) / CHAR), 60))
            fits = max(map(len, step.text.split())) <= max(map(len, after)) and len(after) <= 2
            if not fits and len(before) < len(after):     # the text ends at the arrow's right end
                lines, tx, anchor, extent = before, hi - 8, "end", (hi - 8 - text_width(before), hi)
            else:
                lines, tx, anchor, extent = after, lo + 8, "start", (lo, lo + 8 + text_width(after))
            body.append(("label", lines, tx, y + SIZE, anchor))
            spans.append((min(extent[0], lo), max(extent[1], hi + 26 * (x0 == x1))))
            y += len(lines) * LINE + 4
            if x0 == x1:
                body.append(("path", f"M{num(x0)},{num(y)} h26 v14 h-24", isinstance(step, Reply)))
                y += 14
            else:
                body.append(("path", f"M{num(x0)},{num(y)} H{num(x1)}", isinstance(step, Reply)))
            y += 16
        return y

    end = steps(seq.steps, y, [])
    for row, top, h in zip(rows, head_y, head_h):
        for p in row:
            w = widths[p]
            x = cx[p] - w / 2
            canvas.path(f"M{num(cx[p])},{num(top + h)} V{num(end)}", dashed=True, arrow=False, color=BORDER)
            canvas.rect(x, top, w, h)
            canvas.text(heads[p], x + w / 2, top + (h - len(heads[p]) * LINE) / 2 + SIZE - 1, anchor="middle", bold=True)
    for kind, *args in body:
        if kind == "frame":
            canvas.rect(*args, fill="none", stroke=MUTED, rx=4, width=1)
        elif kind == "text":
            canvas.text(args[0], args[1], args[2], color=MUTED, bold=True)
        elif kind == "label":
            canvas.text(*args[:3], anchor=args[3], backdrop=True)
        else:
            canvas.path(args[0], dashed=args[1])
    return canvas.svg(end + margin)


# --- a flow: rows of nodes, edges from each row to the next --------------------------------------

def draw_flow(flow: Flow, title: str) -> str:
    margin, gap, canvas = 16, 20, Canvas(title)
    row_of = {node: i for i, row in enumerate(flow.rows) for node in row}
    for src, dst, *_ in flow.edges:
        if row_of[dst] != row_of[src] + 1:
            raise ValueError(f"the edge {src} -> {dst} goes from row {row_of[src]} to row {row_of[dst]}; "
                             "a flow's edges go from one row to the next")
    labelled = {row_of[edge[1]] for edge in flow.edges if len(edge) > 2}    # rows whose arrivals carry labels
    place, y = {}, margin
    for i, row in enumerate(flow.rows):
        y += (LINE + 8) * (i in labelled)
        room = min(520, (canvas.width - 2 * margin - gap * (len(row) - 1)) / len(row))
        sizes = {n: wrap(text, int((room - 14) / CHAR)) for n, text in row.items()}
        widths = {n: text_width(lines) + 18 for n, lines in sizes.items()}
        x = (canvas.width - sum(widths.values()) - gap * (len(row) - 1)) / 2
        h = max(len(lines) for lines in sizes.values()) * LINE + 12
        for n in row:
            place[n] = (x, y, widths[n], h)
            x += widths[n] + gap
        y += h + 30
    outs: dict[str, list] = {}
    ins: dict[str, list] = {}
    for edge in flow.edges:
        outs.setdefault(edge[0], []).append(edge)
        ins.setdefault(edge[1], []).append(edge)
    ends = {}
    for node, edges in outs.items():
        x, y0, w, h = place[node]
        for i, edge in enumerate(sorted(edges, key=lambda e: place[e[1]][0])):
            ends[edge, "out"] = (x + w * (i + 1) / (len(edges) + 1), y0 + h)
    for node, edges in ins.items():
        x, y0, w, _ = place[node]
        for i, edge in enumerate(sorted(edges, key=lambda e: place[e[0]][0])):
            ends[edge, "in"] = (x + w * (i + 1) / (len(edges) + 1), y0)
    for edge in flow.edges:
        (x0, y0), (x1, y1) = ends[edge, "out"], ends[edge, "in"]
        mid = (y0 + y1) / 2
        canvas.path(f"M{num(x0)},{num(y0)} C{num(x0)},{num(mid)} {num(x1)},{num(mid)} {num(x1)},{num(y1)}")
        if len(edge) > 2:
            canvas.text([edge[2]], (x0 + x1) / 2, mid + 4, anchor="middle", color=MUTED, backdrop=True)
    for row in flow.rows:
        for node, text in row.items():
            x, y0, w, h = place[node]
            box(canvas, text, x, y0, w, h=h)
    return canvas.svg(y - 30 + margin)


# --- chains: titled panels of steps left to right -----------------------------------------------

def draw_chains(chains: Chains, title: str) -> str:
    margin, pad, gap, canvas = 12, 10, 24, Canvas(title)
    room = canvas.width - 2 * margin - 2 * pad
    y = margin
    for heading, steps in chains.panels:
        head = wrap(heading, int(room / CHAR))
        natural = [text_width(step.split("\n")) + 16 for step in steps]    # each step on its own lines
        free = room - gap * (len(steps) - 1)
        widths = fit(natural, free)
        h = max(len(wrap(step, int((w - 14) / CHAR))) for step, w in zip(steps, widths)) * LINE + 12
        panel_h = pad + len(head) * LINE + 8 + h + pad
        canvas.rect(margin, y, canvas.width - 2 * margin, panel_h, fill="#f3f4f8", stroke=BORDER, rx=8, width=1)
        canvas.text(head, margin + pad, y + pad + SIZE, bold=True)
        top, x = y + pad + len(head) * LINE + 8, margin + pad
        for i, (step, w) in enumerate(zip(steps, widths)):
            if i:
                canvas.path(f"M{num(x - gap + 2)},{num(top + h / 2)} H{num(x - 1)}")
            box(canvas, step, x, top, w, h=h)
            x += w + gap
        y += panel_h + 10
    return canvas.svg(y - 10 + margin)

"""Frame tokens: ``#IFRAME#``-style tokens of a layer's command replaced by one frame's
values (:func:`substitute_tokens`), quoted for the shell where a token stands inside a
``sh -c`` script, so no value can add a word or a command."""

from __future__ import annotations

import re
from typing import Sequence

from cuectl.errors import InvalidInput
from cuectl.run.frame.env import FrameContext, _zpad

__all__ = ["substitute_tokens"]


# Every token Cuebot's DispatchSupportService.prepareRqdRunFrame replaces, and no others
# (OpenCue has no #USER#, #SHOW#, #LOGDIR# or id tokens; the CUE_* variables carry those).
_TOKEN_RE = re.compile(r"#(IFRAME|FRAME|ZFRAME|FRAME_START|FRAME_END|FRAME_CHUNK|FRAMESPEC|LAYER|JOB)#")


def _token_values(ctx: FrameContext, needed: set[str]) -> dict[str, str]:
    frames = ctx.chunk_frames
    values = {
        "IFRAME": str(ctx.frame_number),
        "FRAME": ctx.name,  # the frame's name, 0001-render (as OpenCue)
        "ZFRAME": _zpad(ctx.frame_number),
        "FRAME_START": str(frames[0]),
        "FRAME_END": str(frames[-1]),
        "FRAME_CHUNK": str(ctx.chunk),
        "LAYER": ctx.layer,
        "JOB": ctx.job,
    }
    if "FRAMESPEC" in needed:
        # Lazy: only commands that use the token pay for (and depend on) the frameset module.
        from cuectl.sched.frameset import compact_range

        values["FRAMESPEC"] = compact_range(list(frames))
    return values


def substitute_tokens(command: Sequence[str] | str, ctx: FrameContext) -> list[str]:
    """Replace command tokens and return the argv to execute.

    * argv list: each element has its tokens replaced; no shell is involved, so values need
      no quoting and a hostile job name is just bytes in one argument.
    * shell string: the text runs as ``["/bin/sh", "-c", text]``. A value made only of
      characters no shell treats specially (``[A-Za-z0-9_@%+=:,./-]``: frame numbers, frame
      specs, layer names, most job names) is put in as is. Any other value — only ``#JOB#``
      (and ``#LAYER#``/``#FRAME#`` from a tampered store) can be one — never enters the
      text: the token becomes a reference to the frame variable holding it (``CUE_JOB``,
      ``CUE_LAYER``, ``CUE_FRAME``, set by :func:`frame_env`), quoted to suit where it stands: ``"${CUE_JOB}"`` outside
      quotes, ``${CUE_JOB}`` inside double quotes, ``'"${CUE_JOB}"'`` inside single quotes.
      Each expands to exactly the value, as one word, and the shell never parses a
      variable's value as code — so whatever the name contains, and even where the quoting
      of the user's string is misjudged (here-documents, ``eval``), it can never run code;
      it can at worst read as the reference text. The command must run with the frame's
      environment (the worker always does).

    Tokens (OpenCue's set, as Cuebot's ``prepareRqdRunFrame`` fills them): ``#IFRAME#`` frame
    number; ``#ZFRAME#`` the number zero-padded to 4 (``-1`` -> ``-001``); ``#FRAME#`` the
    frame's name (``0001-render``); ``#FRAME_START#``/``#FRAME_END#`` first/last frame of the
    chunk; ``#FRAME_CHUNK#`` the layer's chunk size; ``#FRAMESPEC#`` the chunk as a compact
    range; ``#LAYER#``; ``#JOB#``. Replacement is a
    single pass, so a name that itself contains ``#FRAME#`` is not expanded again. Unknown
    ``#WORDS#`` are left alone.
    """
    if isinstance(command, str):
        text = command
        if not text.strip():
            raise InvalidInput("command: empty shell command")
        return ["/bin/sh", "-c", _replace_shell(text, ctx)]
    argv = list(command)
    if not argv:
        raise InvalidInput("command: empty argv")
    if not all(isinstance(arg, str) for arg in argv):
        raise InvalidInput("command: every argv element must be a string")
    return [_replace(arg, ctx) for arg in argv]


def _replace(text: str, ctx: FrameContext) -> str:
    needed = set(_TOKEN_RE.findall(text))
    if not needed:
        return text
    values = _token_values(ctx, needed)
    return _TOKEN_RE.sub(lambda m: values[m.group(1)], text)


# Tokens whose value may need more than plain characters, and the frame variable carrying it.
_TOKEN_VARS = {"JOB": "CUE_JOB", "LAYER": "CUE_LAYER", "FRAME": "CUE_FRAME"}
_PLAIN_RE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*", re.ASCII)
_UNQUOTED, _SINGLE, _DOUBLE = "unquoted", "single", "double"
_WORD_BREAKS = " \t\n;&|()<>"


def _replace_shell(text: str, ctx: FrameContext) -> str:
    matches = list(_TOKEN_RE.finditer(text))
    if not matches:
        return text
    values = _token_values(ctx, {m.group(1) for m in matches})
    contexts = _quoting_at(text, {m.start() for m in matches})
    out, last = [], 0
    for m in matches:
        token, value = m.group(1), values[m.group(1)]
        out.append(text[last : m.start()])
        if _PLAIN_RE.fullmatch(value):
            out.append(value)
        else:
            var = _TOKEN_VARS.get(token)
            if var is None:  # numbers and frame specs are always plain
                raise InvalidInput(f"command: token #{token}# has an unexpected value {value!r}")
            quoting = contexts.get(m.start(), _UNQUOTED)
            out.append({_UNQUOTED: f'"${{{var}}}"', _DOUBLE: f"${{{var}}}", _SINGLE: f"'\"${{{var}}}\"'"}[quoting])
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _quoting_at(text: str, positions: set[int]) -> dict[int, str]:
    """The POSIX shell quoting in force at each of ``positions`` of ``text``.

    A small lexer: backslash escapes, '…', "…", ``$( … )``, backticks and ``${ … }``
    (each nesting its own quoting), and ``#`` comments. Here-documents and ``case``
    patterns are not understood; a misjudgement there only changes how a token reads,
    never what runs (see :func:`substitute_tokens`).
    """
    found: dict[int, str] = {}
    # Stack of open constructs: "'" single, '"' double, "(" command substitution (with
    # its paren depth), "`" backticks, "{" parameter expansion (quoted like its parent).
    stack: list[list] = []
    i, n = 0, len(text)

    def quoting() -> str:
        for kind, _ in reversed(stack):
            if kind == "'":
                return _SINGLE
            if kind == '"':
                return _DOUBLE
            if kind in "(`":
                return _UNQUOTED
        return _UNQUOTED

    while i < n:
        if i in positions:
            found[i] = quoting()
            i += 1
            continue
        c = text[i]
        top = stack[-1][0] if stack else None
        if top == "'":
            if c == "'":
                stack.pop()
            i += 1
            continue
        in_double = quoting() == _DOUBLE
        if c == "\\":
            i += 2
            continue
        if c == "$" and text.startswith("$(", i):
            stack.append(["(", 0])
            i += 2
            continue
        if c == "$" and text.startswith("${", i):
            stack.append(["{", 0])
            i += 2
            continue
        if c == "`":
            if top == "`":
                stack.pop()
            else:
                stack.append(["`", 0])
            i += 1
            continue
        if top == "{" and c == "}":
            stack.pop()
            i += 1
            continue
        if in_double:
            if c == '"':
                while stack and stack[-1][0] != '"':  # an unclosed ${ inside "…" ends with it
                    stack.pop()
                if stack:
                    stack.pop()
            i += 1
            continue
        if c == "'":
            stack.append(["'", 0])
        elif c == '"':
            stack.append(['"', 0])
        elif top == "(" and c == "(":
            stack[-1][1] += 1
        elif top == "(" and c == ")":
            if stack[-1][1]:
                stack[-1][1] -= 1
            else:
                stack.pop()
        elif c == "#" and (i == 0 or text[i - 1] in _WORD_BREAKS):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        i += 1
    return found

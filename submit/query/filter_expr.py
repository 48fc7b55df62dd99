"""`--filter`: gcloud's filter expressions (`gcloud topic filters`), as users write them.

    expr    := term | NOT expr | -term | ( expr ) | expr AND expr | expr OR expr
               | expr expr                     (adjacent terms: AND)
    term    := KEY OP VALUE | KEY:*            (KEY:* : the key has a value)
    OP      := = != < <= > >= : ~ !~
    VALUE   := a word, 'quoted' or "quoted", or (v1 v2 ...) for = and : (any of them)

As gcloud: AND and OR side by side need parentheses (`a AND b OR c` is refused, say
which you mean). `=` and `!=` compare whole values, `:` matches a pattern (`*` is any
text), `~` is a regular expression searched in the value (RE2's syntax, matched in
time linear in the value: no pattern can hold `jobs list` or the console), `<`...
compare numbers as numbers, the time fields (createTime, startTime, endTime) as times
(RFC 3339, or a date), anything else as text. A key without a value matches no term but `!=`.

`parse(text, value_of)` returns a predicate over records; `value_of(record, key)` reads
a key (and raises the caller's error for an unknown one, at parse time with record None).
Every mistake is a UsageError in one line: parentheses and NOTs nest at most MAX_DEPTH
deep, and whatever a pattern's compiler raises is caught.
"""
from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Callable
from typing import Any

from submit.errors import UsageError

OPS = ("!=", "<=", ">=", "!~", "=", "<", ">", ":", "~")
TIME_KEYS = ("createTime", "startTime", "endTime", "create_time", "start_time", "end_time")
CASELESS_KEYS = ("state",)
_TOKEN = re.compile(r"""\s*(?:(?P<paren>[()])|(?P<word>(?:'[^']*'|"[^"]*"|[^\s()'"])+))""")
_TERM = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)"
                   r"(?P<op>!=|<=|>=|!~|=|<|>|:|~)(?P<value>.*)", re.S)
Predicate = Callable[[Any], bool]
ValueOf = Callable[[Any, str], Any]
MAX_TEXT = 4096
MAX_DEPTH = 64  # parentheses and NOTs within one another
MAX_REPEAT = 1000  # RE2's largest repetition count
# a counted repetition, {n}, {n,} or {n,m}: RE2 reads one whose count overflows as
# literal text, where Python's re refuses it
_COUNT = re.compile(r"\{\s*([0-9]+)\s*(?:,\s*([0-9]*)\s*)?\}")


def _unquote(text: str) -> str:
    return re.sub(r"""'([^']*)'|"([^"]*)\"""", lambda m: m[1] if m[1] is not None
                  else m[2], text)


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        if not text[at:].strip():
            break
        match = _TOKEN.match(text, at)
        if not match or match.end() == at:
            raise UsageError(f"--filter {text!r:.80}: an unclosed quote at character "
                             f"{at + 1}; close it")
        out.append(match["paren"] or match["word"])
        at = match.end()
    return out


def parse(text: str, value_of: ValueOf) -> Predicate:
    """The filter as a predicate; UsageError naming the mistake."""
    if len(text) > MAX_TEXT:
        raise UsageError(f"--filter is {len(text)} characters; write at most {MAX_TEXT}")
    tokens = _tokens(text)
    if not tokens:
        return lambda record: True
    parser = _Parser(tokens, value_of, text)
    try:
        predicate = parser.expression()
    except RecursionError:  # MAX_DEPTH keeps far from it; never a traceback regardless
        raise UsageError(f"--filter {text!r:.80}: nested too deep; write at most "
                         f"{MAX_DEPTH} parentheses or NOTs within one another") from None
    if parser.at < len(tokens):
        raise UsageError(f"--filter {text!r:.80}: unexpected {tokens[parser.at]!r:.40}; "
                         "check its parentheses")
    return predicate


class _Parser:
    def __init__(self, tokens: list[str], value_of: ValueOf, text: str):
        self.tokens, self.value_of, self.text, self.at = tokens, value_of, text, 0
        self.depth = 0

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UsageError(f"--filter {self.text!r:.80}: nested too deep; write at most "
                             f"{MAX_DEPTH} parentheses or NOTs within one another")

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def expression(self) -> Predicate:
        parts = [self.unary()]
        joiner = None
        while (word := self.peek()) is not None and word != ")":
            this = "OR" if word == "OR" else "AND"
            if word in ("AND", "OR"):
                self.at += 1
            if joiner is not None and joiner != this:
                raise UsageError(f"--filter {self.text!r:.80}: AND and OR side by side "
                                 "need parentheses, as in gcloud; write e.g. 'a AND (b "
                                 "OR c)'")
            joiner = this
            parts.append(self.unary())
        if len(parts) == 1:
            return parts[0]
        either = joiner == "OR"

        def joined(record: Any) -> bool:
            return any(p(record) for p in parts) if either else \
                all(p(record) for p in parts)
        return joined

    def unary(self) -> Predicate:
        word = self.peek()
        if word is None or word in ("AND", "OR", ")"):
            raise UsageError(f"--filter {self.text!r:.80}: a term is missing"
                             + (f" before {word}" if word else " at its end"))
        if word == "NOT":
            self.at += 1
            self.deeper()
            inner = self.unary()
            self.depth -= 1
            return lambda r: not inner(r)
        if word == "(":
            self.at += 1
            self.deeper()
            inner = self.expression()
            if self.peek() != ")":
                raise UsageError(f"--filter {self.text!r:.80}: a ( is not closed")
            self.at += 1
            self.depth -= 1
            return inner
        self.at += 1
        if word.startswith("-") and len(word) > 1:
            inner = self.term(word[1:])
            return lambda r: not inner(r)
        return self.term(word)

    def term(self, word: str) -> Predicate:
        match = _TERM.fullmatch(word)
        if not match:
            raise UsageError(f"--filter {word!r:.60} is not KEY=VALUE or KEY:PATTERN "
                             "(or KEY<op>VALUE, op one of != < <= > >= ~); write e.g. "
                             "--filter 'state=RUNNING labels.team=vision'")
        key, op, raw = match["key"], match["op"], match["value"]
        self.value_of(None, key)  # an unknown key is an error before any record is read
        if raw == "" and self.peek() == "(" and op in ("=", ":"):
            wanted = self.value_list()
        else:
            if raw == "":
                raise UsageError(f"--filter {word!r:.60}: {key}{op} needs a value")
            wanted = [_unquote(raw)]
        if op == ":" and wanted == ["*"]:
            return lambda r: self.value_of(r, key) not in (None, "", {}, [])
        test = _comparison(key, op, wanted, word)
        return lambda r: test(self.value_of(r, key))

    def value_list(self) -> list[str]:
        self.at += 1  # (
        values = []
        while (word := self.peek()) not in (")", None):
            self.at += 1
            if word not in ("OR", ","):
                values.append(_unquote(word))
        if word is None or not values:
            raise UsageError(f"--filter {self.text!r:.80}: a value list (a b ...) is "
                             "empty or not closed")
        self.at += 1
        return values


def _comparison(key: str, op: str, wanted: list[str], word: str) -> Callable[[Any], bool]:
    if op in ("~", "!~"):
        pattern = _regex(wanted[0], word)

        def regex(value: Any) -> bool:
            found = value is not None and pattern.search(str(value)) is not None
            return found if op == "~" else not found
        return regex
    base = key.rsplit(".", 1)[-1]
    timed = base in TIME_KEYS
    goal = [_time(w, word) for w in wanted] if timed else wanted

    def compare(value: Any) -> bool:
        if value is None:
            return op == "!="
        if timed:
            mine: Any = float(value)
            wants: list[Any] = goal
        elif op in ("<", "<=", ">", ">=") and _number(value) is not None and \
                _number(goal[0]) is not None:
            mine, wants = _number(value), [_number(goal[0])]
        else:
            mine, wants = str(value), list(goal)
            if base in CASELESS_KEYS:
                mine, wants = mine.upper(), [w.upper() for w in wants]
        if op == "=":
            return mine in wants
        if op == "!=":
            return mine not in wants
        if op == ":":
            return any(fnmatch.fnmatchcase(str(mine), str(w)) if not timed else mine == w
                       for w in wants)
        other = wants[0]
        return {"<": mine < other, "<=": mine <= other, ">": mine > other,
                ">=": mine >= other}[op]
    return compare


def _regex(text: str, word: str):
    """The pattern compiled by RE2 (linear-time matching); a one-line UsageError for any
    pattern it refuses, and for repetition counts past its limit."""
    for match in _COUNT.finditer(text):
        if any(n and int(n) > MAX_REPEAT for n in match.groups()):
            raise UsageError(f"--filter {word!r:.60}: the repetition {match[0]!r:.30} "
                             f"counts past {MAX_REPEAT}; write a smaller count")
    try:
        import re2
    except ImportError:
        raise UsageError("--filter: a ~ pattern needs the google-re2 package; install "
                         "it (pip install google-re2)") from None
    options = re2.Options()
    options.log_errors = False  # the error is ours to say, in one line
    try:
        return re2.compile(text, options)
    except Exception as exc:  # re2.error, and whatever else its compiler raises
        why = exc.args[0] if exc.args else exc
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise UsageError(f"--filter {word!r:.60}: not a regular expression RE2 takes "
                         f"({' '.join(why.split())[:120]}); fix it (RE2 has no "
                         "look-arounds or back-references)") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _time(text: str, word: str) -> float:
    """RFC 3339 (`2021-01-15T19:00:00Z`, an offset, no zone: UTC) or a date, as seconds."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--filter {word!r:.60}: {text!r:.40} is not a time; write e.g. "
                         "2021-01-15T19:00:00Z or 2021-01-15") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()

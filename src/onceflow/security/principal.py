"""`ssl.principal.mapping.rules`: the principal name of an mTLS client from its
certificate's subject, with Kafka's rule syntax.

Theory of operation: the rules are a comma-separated list, tried in order on the
subject's RFC 2253 text (e.g. `CN=app,OU=eng,O=Acme`); the first that applies gives
the name, and the principal is `User:` + that name. `DEFAULT` applies to every subject
and keeps it unchanged (the only rule when none is configured). `RULE:pattern/
replacement/` applies when the regular expression matches the whole subject and gives
the subject with every match of the pattern replaced (`$1`... refer to its groups, as
in Java); a trailing `L` or `U` lower- or upper-cases the result. When no rule applies,
the client is not authenticated and its connection is closed, as Kafka refuses it.
Patterns are Python regular expressions, which agree with Java's for the usual
subject patterns (groups, classes, anchors, lazy quantifiers).
"""

from __future__ import annotations

import dataclasses
import re

DEFAULT_RULES = "DEFAULT"
# A rule: DEFAULT | RULE:pattern/replacement/[LU] | anything else (rejected); `\/` and
# `\\` escape inside pattern and replacement. The same alternatives as Kafka's parser.
_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")
_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")
# Rules come from the operator, not from peers; still, a bound keeps a typo from
# compiling a megabyte of regular expressions.
RULES_CHARS_MAX = 64 * 1024


class MappingRuleError(ValueError):
    """A rule that is not DEFAULT or RULE:pattern/replacement/[LU]."""


@dataclasses.dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""                   # "", "L" or "U"

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        if self.pattern.fullmatch(subject) is None:
            return None
        result = self.pattern.sub(lambda match: _expand(self.replacement, match), subject)
        if self.case == "L":
            return result.lower()
        return result.upper() if self.case == "U" else result


@dataclasses.dataclass(frozen=True)
class PrincipalMapper:
    rules: tuple[_Rule, ...]

    def name(self, subject: str) -> str | None:
        """The principal name for an RFC 2253 subject; None when no rule applies."""
        for rule in self.rules:
            found = rule.apply(subject)
            if found is not None:
                return found
        return None


def parse_mapping_rules(text: str | None) -> PrincipalMapper:
    """Kafka's `ssl.principal.mapping.rules` value as a mapper; MappingRuleError names the
    bad rule. Empty rules are skipped, as Kafka skips them."""
    text = DEFAULT_RULES if text is None else text
    if len(text) > RULES_CHARS_MAX:
        raise MappingRuleError(f"ssl.principal.mapping.rules is over {RULES_CHARS_MAX} characters")
    rules = []
    for match in _SPLITTER.finditer(text.strip()):
        rule = match.group(1)
        parsed = _PARSER.match(rule)
        if parsed is None or parsed.end() != len(rule):
            raise MappingRuleError(f"invalid ssl.principal.mapping.rules rule: {rule!r}")
        if parsed.group(1) is not None:
            rules.append(_Rule(None))
        elif parsed.group(2) is not None:
            try:
                pattern = re.compile(parsed.group(2))
            except re.error as exc:
                raise MappingRuleError(f"invalid pattern in rule {rule!r}: {exc}") from None
            rules.append(_Rule(pattern, parsed.group(3), parsed.group(4)))
        if match.end() == len(text.strip()):
            break
    return PrincipalMapper(tuple(rules))


def _expand(replacement: str, match: re.Match[str]) -> str:
    """Java's Matcher replacement: `$n` is group n (a reference past the last group drops
    digits from its end until it names one, else stays literal), `\\x` is x."""
    out: list[str] = []
    groups = match.re.groups
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
            continue
        reference = _BACK_REFERENCE.match(replacement, i) if char == "$" else None
        if reference is None:
            out.append(char)
            i += 1
            continue
        digits = reference.group(1)
        while len(digits) > 1 and int(digits) > groups:
            digits = digits[:-1]
        if int(digits) > groups:
            out.append(reference.group(0))  # no such group: literal, as Kafka keeps it
            i = reference.end()
            continue
        out.append(match.group(int(digits)) or "")
        i += 1 + len(digits)
    return "".join(out)

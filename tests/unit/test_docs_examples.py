"""Every sentence the README, docs/ and the notebook feed to the quick start's demo model is one of
the demo's own sentences (data/demo.py's templates, numbers spelled out), and where a page shows
its German, that is the generator's reference: the demo cannot translate "Twenty-one dogs." or
"She was born in 1999.", which earlier pages showed it."""

from __future__ import annotations

import json
import random
import re

import pytest

from flaxformer_nmt.data import demo

import helpers

# Each example: the template and the number that make it.
EXAMPLES = {
  "We need forty-two chairs.": (demo._chairs, 42),
  "We need three hundred and forty-two chairs.": (demo._chairs, 342),
  "She was born in nineteen ninety-nine.": (demo._born, 1999),
  "I have twenty-one apples.": (demo._apples, 21),
  "He is nine years old.": (demo._age, 9),
  "in the year nineteen eighty-four": (demo._in_year, 1984),
  "three hundred and five": (demo._bare_cardinal, 305),
  "three hundred and forty-five": (demo._bare_cardinal, 345),
}


class _Fixed(random.Random):
  """A random source whose every randint is `n`: a template then writes exactly that number."""

  def __init__(self, n: int) -> None:
    super().__init__(0)
    self.n = n

  def randint(self, a: int, b: int) -> int:
    return self.n


def reference(sentence: str) -> str:
  template, n = EXAMPLES[sentence]
  english, german = template(_Fixed(n))
  assert english == sentence, (english, sentence)
  return german


def fed_to_the_demo() -> set[str]:
  """The sentences the pages give the demo: `echo "..." |`, `printf '...'`, `--text="..."`, the
  API's lists, the server's "text", the notebook's `sentences`."""
  found: set[str] = set()
  for path in [helpers.REPO / "README.md", *sorted((helpers.REPO / "docs").glob("*.md"))]:
    text = path.read_text("utf-8")
    found |= set(re.findall(r'echo "([^"]+)" \| flaxformer-nmt', text))
    for printed, target in re.findall(r"printf '([^']+)' > (\S+)", text):
      if not target.startswith("terms"):  # a --constraints file holds terms, not sentences
        found |= {line for line in printed.split("\\n") if line}
    found |= set(re.findall(r'--text="([^".]+[^"]*)"', text))
    for listed in re.findall(r'(?:lines = |translate\([^\[]*)\[("[^\]]+")\]', text):
      found |= set(re.findall(r'"([^"]+)"', listed))
    for body in re.findall(r"-d '(\{[^']+\})'", text):
      value = json.loads(body)["text"]
      found |= set(value if isinstance(value, list) else [value])
  notebook = json.loads((helpers.REPO / "notebooks" / "colab.ipynb").read_text("utf-8"))
  for cell in notebook["cells"]:
    source = "".join(cell["source"])
    if source.startswith("sentences = ["):
      found |= set(re.findall(r'"([^"]+)"', source.split("]")[0]))
  return found


def test_every_example_is_a_sentence_of_the_demo():
  fed = fed_to_the_demo()
  assert "We need forty-two chairs." in fed and len(fed) >= 6  # the search finds them
  assert fed == set(EXAMPLES), (sorted(fed - set(EXAMPLES)), sorted(set(EXAMPLES) - fed))


@pytest.mark.parametrize("sentence", sorted(EXAMPLES))
def test_each_example_has_the_generators_reference(sentence):
  assert reference(sentence)


def test_shown_translations_are_the_references():
  """serving.md shows the server's answer to two examples: the generator's German."""
  text = (helpers.REPO / "docs" / "serving.md").read_text("utf-8")
  asked = re.search(r"-d '(\{\"text\": \[[^']+\})'\n# (\{[^\n]+\})", text)
  sentences, answer = json.loads(asked.group(1))["text"], json.loads(asked.group(2))
  assert answer["translations"] == [reference(s) for s in sentences]

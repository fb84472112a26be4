"""``toy``: a generated, clearly synthetic NLI corpus (not a benchmark) for smoke tests and demos.

Premises are templated ("a tall man is playing guitar in a park"). Each premise gets one
hypothesis per class, made by a rule a model can learn in a few epochs:
  entailment    - a hypernym ("a person", "playing an instrument", "outdoors") or a dropped
                  modifier ("a man is playing guitar");
  contradiction - an incompatible activity ("is sleeping"), a negation ("is not playing guitar"),
                  the opposite place ("indoors") or the opposite person ("a woman");
  neutral       - added information ("for a crowd", "a famous man", a place the premise lacks).
With two classes, neutral and contradiction become ``not_entailment``. The same size and seed give
the same corpus; train/dev/test never share a premise.
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

from nli_models.data.readers import NLI_LABELS, RTE_LABELS
from nli_models.data.records import NLIExample, NLISplit

# word -> hypernym
_SUBJECTS = {
    "man": "person",
    "woman": "person",
    "boy": "child",
    "girl": "child",
    "teenager": "person",
    "chef": "person",
    "doctor": "person",
    "student": "person",
    "musician": "person",
    "grandmother": "person",
}
_OPPOSITE = {"man": "woman", "woman": "man", "boy": "girl", "girl": "boy"}
_ADJECTIVES = ("tall", "young", "smiling", "tired", "happy", "short", "busy")
_NEUTRAL_ADJECTIVES = ("famous", "professional", "rich", "french")
# activity -> hypernym
_ACTIVITIES = {
    "playing guitar": "playing an instrument",
    "playing the piano": "playing an instrument",
    "playing the violin": "playing an instrument",
    "eating an apple": "eating fruit",
    "eating a banana": "eating fruit",
    "eating a sandwich": "eating food",
    "reading a book": "reading something",
    "reading a newspaper": "reading something",
    "riding a bicycle": "riding something",
    "riding a horse": "riding an animal",
    "kicking a ball": "playing with a ball",
    "painting a picture": "making art",
}
_PLACES = {
    "in a park": "outdoors",
    "on the beach": "outdoors",
    "on a street": "outdoors",
    "in a garden": "outdoors",
    "in a kitchen": "indoors",
    "in a classroom": "indoors",
    "in a living room": "indoors",
    "in an office": "indoors",
}
_FLIP_PLACE = {"outdoors": "indoors", "indoors": "outdoors"}
_PURPOSES = (
    "for a crowd",
    "to win a prize",
    "before dinner",
    "for the first time",
    "with a friend",
)

Premise = tuple[str, str | None, str, str | None]  # subject, adjective, activity, place


def _sentence(subject: str, adjective: str | None, activity: str, place: str | None) -> str:
    noun = f"{adjective} {subject}" if adjective else subject
    article = "an" if noun[0] in "aeiou" else "a"
    return " ".join(part for part in (article, noun, "is", activity, place) if part)


def _entailment(p: Premise, rng: random.Random) -> str:
    subject, adjective, activity, place = p
    rules = [
        lambda: _sentence(_SUBJECTS[subject], adjective, activity, place),
        lambda: _sentence(subject, adjective, _ACTIVITIES[activity], place),
    ]
    if adjective:
        rules.append(lambda: _sentence(subject, None, activity, place))
    if place:
        rules.append(lambda: _sentence(subject, adjective, activity, None))
        rules.append(lambda: _sentence(subject, adjective, activity, _PLACES[place]))
    return rng.choice(rules)()


def _contradiction(p: Premise, rng: random.Random) -> str:
    subject, adjective, activity, place = p
    rules = [
        lambda: _sentence(subject, adjective, "sleeping", place),
        lambda: _sentence(subject, adjective, f"not {activity}", place),
    ]
    if place:
        rules.append(lambda: _sentence(subject, adjective, activity, _FLIP_PLACE[_PLACES[place]]))
    if subject in _OPPOSITE:
        rules.append(lambda: _sentence(_OPPOSITE[subject], adjective, activity, place))
    return rng.choice(rules)()


def _neutral(p: Premise, rng: random.Random) -> str:
    subject, adjective, activity, place = p
    rules = [lambda: f"{_sentence(subject, adjective, activity, place)} {rng.choice(_PURPOSES)}"]
    if not adjective:
        rules.append(lambda: _sentence(subject, rng.choice(_NEUTRAL_ADJECTIVES), activity, place))
    if not place:
        rules.append(lambda: _sentence(subject, adjective, activity, rng.choice(list(_PLACES))))
    return rng.choice(rules)()


def _all_premises() -> list[Premise]:
    return list(product(_SUBJECTS, (None, *_ADJECTIVES), _ACTIVITIES, (None, *_PLACES)))


MAX_PREMISES = len(_all_premises())


def make_toy_corpus(
    size: int = 3000,
    seed: int = 0,
    num_classes: int = 3,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> dict[str, NLISplit]:
    """``size`` pairs in all (rounded down to a multiple of ``num_classes``: every premise gets
    one hypothesis per class, so each split is exactly label-balanced), split by premise into
    train/dev/test."""
    if num_classes not in (2, 3):
        raise ValueError(f"toy num_classes must be 2 or 3, got {num_classes}")
    premises_wanted = size // num_classes
    if not 10 <= premises_wanted <= MAX_PREMISES:
        raise ValueError(
            f"toy size must be between {10 * num_classes} and {MAX_PREMISES * num_classes} "
            f"for {num_classes} classes, got {size}"
        )
    rng = random.Random(seed)
    premises = rng.sample(_all_premises(), premises_wanted)
    n_dev = max(1, round(dev_fraction * premises_wanted))
    n_test = max(1, round(test_fraction * premises_wanted))
    parts = {
        "train": premises[n_dev + n_test :],
        "dev": premises[:n_dev],
        "test": premises[n_dev : n_dev + n_test],
    }
    labels = NLI_LABELS if num_classes == 3 else RTE_LABELS
    splits = {}
    for name, chosen in parts.items():
        examples = []
        for i, premise in enumerate(chosen):
            text = _sentence(*premise)
            pairs = [("entailment", _entailment(premise, rng))]
            if num_classes == 3:
                pairs += [
                    ("neutral", _neutral(premise, rng)),
                    ("contradiction", _contradiction(premise, rng)),
                ]
            else:  # alternate the two kinds of non-entailment so both are learned
                other = _neutral if i % 2 else _contradiction
                pairs.append(("not_entailment", other(premise, rng)))
            examples += [NLIExample(text, hypothesis, label) for label, hypothesis in pairs]
        rng.shuffle(examples)
        examples = [replace(e, pair_id=f"toy-{name}-{i:05d}") for i, e in enumerate(examples)]
        source = f"toy(size={size}, seed={seed}, num_classes={num_classes})"
        splits[name] = NLISplit(name, examples, labels, source=source, meta={"synthetic": True})
    return splits

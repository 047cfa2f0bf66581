"""No two models share a topic (issue 37, item 8): ``<p>.model.m.backfill.dlq`` was both model ``m``'s backfill
dead-letter topic and model ``m.backfill``'s dead-letter topic, so the ACL planner granted it to both and
``m``'s backfill dead letters counted as errors in ``m.backfill``'s rollout gates.  Every name a model owns under
``<p>.model.`` now has exactly one word after the model, so the owner of a topic is unique."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie.kernel.acls import ROLES, AclRule, ModelScope, _check_model_grants, plan
from sie.kernel.errors import ConfigError
from sie.kernel.names import MODEL_NAME_RE, Names

NAMES = Names("sie")
MODEL = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,12}", fullmatch=True).filter(lambda m: bool(MODEL_NAME_RE.fullmatch(m)))


def test_a_models_backfill_dead_letters_are_not_another_models_dead_letters():
    own = set(NAMES.own_data_topics("m"))
    other = set(NAMES.own_data_topics("m.backfill"))
    assert NAMES.model_topics("m.backfill").dead_letters not in own
    assert own.isdisjoint(other), own & other
    assert NAMES.backfill_dead_letter_topic(NAMES.model_topics("m").backfill_results) == "sie.model.m.backfill-dlq"


@given(MODEL, MODEL)
def test_no_two_models_share_a_topic_and_each_topic_has_one_owner(a: str, b: str):
    if a == b:
        return
    assert set(NAMES.own_data_topics(a)).isdisjoint(NAMES.own_data_topics(b))
    for topic in NAMES.own_data_topics(a):
        assert NAMES.model_of_topic(topic) == a, topic
        assert NAMES.data_topic_problem(b, topic) is not None, (b, topic)  # b may not name a's topic


@pytest.mark.parametrize("role", [r for r in ROLES if r not in ("agent", "control")])
def test_the_planner_grants_one_model_nothing_of_another_sharing_its_prefix(role: str):
    scope = {"models": [ModelScope.default(NAMES, "m")]}
    if role == "cdc":
        scope.update(connector="c", source_topics=["shop.orders"])
    if role == "backfill":
        scope.update(job="j")
    granted = {r.name for r in plan(NAMES, role, "p", **scope) if r.resource == "topic"}  # type: ignore[arg-type]
    assert granted.isdisjoint(NAMES.own_data_topics("m.backfill")), granted
    assert granted.isdisjoint(NAMES.own_data_topics("m.dlq")), granted


def test_the_planners_last_check_refuses_another_models_topic_even_in_a_hand_built_plan():
    rule = AclRule("User:p", "topic", NAMES.model_topics("m.backfill").dead_letters, "literal", "write")
    with pytest.raises(ConfigError, match="model m.backfill's topic"):
        _check_model_grants(NAMES, "backfill", [rule], [ModelScope.default(NAMES, "m")])
    wide = AclRule("User:p", "topic", "sie.model.m", "prefixed", "read")
    with pytest.raises(ConfigError, match="other models' topics"):
        _check_model_grants(NAMES, "scorer", [wide], [ModelScope.default(NAMES, "m")])

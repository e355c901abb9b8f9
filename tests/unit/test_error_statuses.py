"""Every engine error names its HTTP status (the API answers with it), and the statuses are
the ones the API gave by code before the engine named them."""

import inspect

import pytest

from durable_agents.engine import errors

EXPECTED = {
    # missing things
    errors.NotFound: 404,
    errors.ApprovalNotFound: 404,
    # conflicts with the run's state
    errors.Conflict: 409,
    errors.ApprovalAlreadyDecided: 409,
    errors.ApprovalOrphaned: 409,
    errors.HaltAlreadyResolved: 409,
    errors.HaltInFlight: 409,
    errors.HaltTooYoung: 409,
    errors.NoLiveAttempt: 409,
    errors.HaltOrphaned: 409,
    errors.RunBusy: 409,
    errors.LeaseLost: 409,
    errors.DriveStopped: 409,
    errors.ReplayDiverged: 409,
    # who acts
    errors.ApproverNotEligible: 403,
    errors.ActorForbidden: 403,
    errors.ActorInactive: 403,
    # bad input, by category
    errors.ConfigError: 400,
    errors.ActorError: 400,
    errors.ApprovalBadSignature: 400,
    errors.AgentDrift: 400,
    errors.ProtocolError: 400,
    errors.ToolError: 400,
    errors.BudgetError: 400,
    # someone else's failure
    errors.ModelError: 502,
    errors.StorageError: 503,
    errors.DurableAgentsError: 500,
}


@pytest.mark.parametrize(
    "cls", sorted(EXPECTED, key=lambda c: c.__name__), ids=lambda c: c.__name__
)
def test_each_error_names_the_status_the_api_gave_it(cls):
    assert cls.http_status == EXPECTED[cls]


def test_every_engine_error_has_a_code_and_a_status():
    classes = [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.DurableAgentsError)
    ]
    assert len(classes) >= 30
    for cls in classes:
        assert isinstance(cls.code, str) and cls.code, cls
        assert 400 <= cls.http_status < 600, cls


def test_an_ad_hoc_code_keeps_its_class_status():
    exc = errors.Conflict("run 'r' is finished", code="run.finished")
    assert (exc.code, exc.http_status) == ("run.finished", 409)
    assert isinstance(exc, errors.ConfigError)

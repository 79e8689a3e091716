"""How the suite spreads over pytest-xdist's workers (pyproject's `-n 2 --dist loadgroup`): what one test run builds
once stays once."""


def test_every_test_sharing_a_module_scoped_fixture_is_in_an_xdist_group(request):
    """loadgroup hands an ungrouped test to whichever worker is free, so a module fixture (a trained run, an engine)
    was built on each worker that ran one of its tests; tests/conftest.py groups them by module."""
    loose = []
    for item in request.session.items:
        info = getattr(item, "_fixtureinfo", None)
        scopes = {d[-1].scope for d in info.name2fixturedefs.values() if d} if info is not None else set()
        if "module" in scopes and item.get_closest_marker("xdist_group") is None:
            loose.append(item.nodeid)
    assert loose == []


def test_the_tests_reading_the_shortened_demo_share_its_worker(request):
    """demo_run (tests/conftest.py) is session-scoped: built once on each worker that runs a test asking for it, so
    every such test (tests/test_demo_run.py, the notebook's smoke run) is in the group "demo"."""
    groups = {item.nodeid: item.get_closest_marker("xdist_group") for item in request.session.items
              if "demo_run" in getattr(item, "fixturenames", ())}
    elsewhere = {nodeid: mark and mark.args[0] for nodeid, mark in groups.items() if not mark or mark.args[0] != "demo"}
    assert elsewhere == {}

"""The agent's HTTP port (issue 38, item 4): /metrics stays open; a replica's worker log needs an API token, never
reads outside the work directory, and streams what is appended while followed; ``rotate_log`` keeps the log of the
process before a (re)start for ``--previous``."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest

from sie.workers.agent.http import AgentHttp, rotate_log
from tests.support.helpers import wait_until

TOKEN = "sie_agent-test-token"


class Tokens:
    def authenticate(self, token: str | None) -> object | None:
        return object() if token == TOKEN else None


@pytest.fixture()
def agent(tmp_path: Path):
    work = tmp_path / "node-a"
    (work / "m-0").mkdir(parents=True)
    (work / "m-0" / "worker.log").write_text("".join(f"line {i}\n" for i in range(200)))
    server = AgentHttp("node-a", work, lambda: b"sie_node_info 1\n", Tokens())
    port = server.start(0, "127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}", work
    finally:
        server.stop()


def _get(url: str, token: str | None = TOKEN, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, params=params, headers=headers, timeout=10)


def test_metrics_stay_open_and_a_log_needs_a_token(agent):
    base, _ = agent
    assert _get(base + "/metrics", token=None).text == "sie_node_info 1\n"
    for token in (None, "sie_wrong"):
        answer = _get(base + "/v1/replicas/m-0/log", token=token)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
    answer = _get(base + "/v1/replicas/m-0/log", lines="3")
    assert answer.status_code == 200 and answer.text == "line 197\nline 198\nline 199\n"


@pytest.mark.parametrize("replica", ["..", "%2e%2e%2fnode-b", ".hidden", "a%2fb"])
def test_an_id_that_is_not_a_folder_name_is_refused(agent, replica):
    base, _ = agent
    assert _get(f"{base}/v1/replicas/{replica}/log").status_code in (400, 404)


def test_unknown_replica_and_missing_previous_log_are_404_naming_them(agent):
    base, work = agent
    answer = _get(base + "/v1/replicas/m-9/log")
    assert answer.status_code == 404 and answer.text == "replica m-9 has no log on node node-a\n"
    answer = _get(base + "/v1/replicas/m-0/log", previous="1")
    assert answer.status_code == 404 and answer.text == "replica m-0 has no log of a previous process on node node-a\n"
    rotate_log(work / "m-0")  # the next process starts: this one's log is the previous one
    (work / "m-0" / "worker.log").write_text("restarted\n")
    assert _get(base + "/v1/replicas/m-0/log", previous="1", lines="1").text == "line 199\n"
    assert _get(base + "/v1/replicas/m-0/log").text == "restarted\n"


def test_follow_streams_what_is_appended_and_ends_when_the_client_leaves(agent):
    base, work = agent
    got: list[str] = []
    assert any("process_request_thread" in t.name for t in threading.enumerate()) is False
    with httpx.stream("GET", base + "/v1/replicas/m-0/log", params={"lines": "1", "follow": "1"},
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=httpx.Timeout(10, read=30)) as answer:
        chunks = answer.iter_text()
        got.append(next(chunks))
        with (work / "m-0" / "worker.log").open("a") as fh:
            fh.write("appended later\n")
        while "appended later" not in "".join(got):
            got.append(next(chunks))
        assert any("process_request_thread" in t.name for t in threading.enumerate())  # it is being served
    assert "".join(got) == "line 199\nappended later\n"
    # the follower's thread ends once its client is gone (no thread waiting on a quiet log forever)
    wait_until(lambda: not [t for t in threading.enumerate() if "process_request_thread" in t.name and t.is_alive()],
               10, 0.1, "the follower's thread to end")


def test_a_raw_client_that_hangs_up_mid_follow_does_not_break_the_server(agent):
    base, _ = agent
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET /v1/replicas/m-0/log?follow=1&lines=0 HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert s.recv(1024).startswith(b"HTTP/1.0 200")
    assert _get(base + "/v1/replicas/m-0/log", lines="1").text == "line 199\n"

"""The Ray Serve deployment (slow): a Ray head on loopback, 2 replicas of the fixture model
behind Ray's HTTP proxy, driven with the openai client. Bounded: about a minute."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_app(fixture_folders):
    from genai.serve.ray_serve import build_app
    from genai.serve.server import free_port

    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(
            {"model": str(fixture_folders["gqa"]), "num_replicas": 2, "num_cpus": 1, "threads": 1}
        )
        serve.run(app, name="genai", route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Ray Serve app did not come up"
            time.sleep(0.5)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_serve_the_openai_api(ray_app):
    status = serve.status().applications["genai"]
    replicas = status.deployments["genai"].replica_states
    assert replicas.get("RUNNING") == 2

    client = openai.OpenAI(base_url=ray_app + "/v1", api_key="unused", max_retries=0)
    name = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert reply.usage.completion_tokens >= 1
    streamed = client.completions.create(
        model=name, prompt="ray", max_tokens=8, temperature=0, stream=True
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    whole = client.completions.create(model=name, prompt="ray", max_tokens=8, temperature=0)
    assert text == whole.choices[0].text

    # both replicas answer, with the same tokens
    def ask(_):
        health = httpx.get(ray_app + "/health", timeout=30).json()
        return health["pid"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        pids = set(pool.map(ask, range(40)))
    assert len(pids) == 2
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=name, messages=[], max_tokens=2)


def test_build_app_options():
    """Fixed replicas, autoscaling bounds and engine options reach the deployment."""
    from genai.serve.ray_serve import build_app, deployment_options

    assert deployment_options(num_replicas=3)["num_replicas"] == 3
    auto = deployment_options(min_replicas=2, max_replicas=6)["autoscaling_config"]
    assert auto == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 16.0}
    app = build_app(
        {"model": "/m", "min_replicas": "1", "max_replicas": "4", "threads": "2", "max_slots": 8}
    )
    deployment = app._bound_deployment
    config = deployment._deployment_config
    assert config.autoscaling_config.max_replicas == 4
    assert deployment.ray_actor_options["num_cpus"] == 2.0
    assert app._bound_deployment.init_args == (
        "/m",
        {"threads": 2, "max_slots": 8},
        None,
        (),
        None,  # create_app's default for what the model takes
        True,
        False,
    )
    keyed = build_app(
        {
            "model": "/m",
            "api_key": "k3y",
            "allowed_origins": "http://a, http://b",
            "max_body_bytes": "1000",
            "webui": "false",
            "allow_remote_images": "true",
        }
    )
    assert keyed._bound_deployment.init_args == (
        "/m",
        {},
        "k3y",
        ("http://a", "http://b"),
        1000,
        False,
        True,
    )
    with pytest.raises(ValueError):
        build_app({})

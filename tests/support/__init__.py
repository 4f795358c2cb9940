"""What the tests share that is not a fixture (fixtures live in the conftest.py files).

Imported as `support.<module>` (pyproject.toml puts tests/ on pytest's pythonpath):

    stacks          the test image and the Compose files/templates the tests deploy
    waiting         until(): wait for a condition on in-process state or over HTTP
    renter          Renter: a renter using the marketplace's public HTTP API
    agent_config    make_config(): an AgentConfig for an agent in the test's event loop
    engine          what tests create in and clean up from the real Docker Engine
    agent_process   `gpuhost-agent run` as a real process, a restartable local marketplace
    fakes           stand-ins for the agent's own classes, typed against the real ones
    fake_nvml       the stand-in NVML library (tests/fake_nvml/) and GPU presets
    openapi_check   docs/*.yaml loading and strict schema checks
    renter_streams  a renter's side of the log and terminal endpoints
    machine_samples probes of a machine, shaped as the agent builds them
    install_script  install.sh's documented messages
    sandbox_corpus  the hostile and legitimate Compose files of tests/sandbox_corpus/
"""

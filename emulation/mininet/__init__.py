"""A topology brought up as a Mininet network, and the ``inalab emulate`` command.

- :mod:`~emulation.mininet.network`: hosts, links and inalab's switches in Mininet;
- :mod:`~emulation.mininet.datapaths`: who emulates each link, which data plane runs;
- :mod:`~emulation.mininet.overrides`: the command line's changes to a topology;
- :mod:`~emulation.mininet.check`: ``emulate TOPOLOGY check``, a run said, not built;
- :mod:`~emulation.mininet.emulate`: ``inalab emulate``: bring up, bench, CLI or wait;
- :mod:`~emulation.mininet.fabric`: the bench's ranks in the hosts, INA on the switches;
- :mod:`~emulation.mininet.roce`: INA over RoCEv2 there (``bench --transport rdma``);
- :mod:`~emulation.mininet.run`: ``emulate TOPOLOGY run -- COMMAND``, one process a rank;
- :mod:`~emulation.mininet.linkcontrol`: a job's own changes to its links' rate;
- :mod:`~emulation.mininet.registry`: the emulations live on this machine;
- :mod:`~emulation.mininet.hostrun`: one rank of an allreduce inside an emulated host.

It stands above the switch targets and the topology data, and needs root to run.
"""

__all__: list[str] = []

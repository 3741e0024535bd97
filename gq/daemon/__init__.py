"""The node daemon: the one process that opens the queue. ``node.py`` is its life cycle and
loop; ``serving/`` answers clients, ``supervision/`` runs jobs through the execution hosts
and records what they report, ``scheduling/`` decides what runs where, ``forecasts/`` says
when jobs will start, ``monitoring/`` samples the devices, guards them and serves metrics."""

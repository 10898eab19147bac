"""What every asset of the pipeline shares, below the stages: its settings resolved per dataset
(`asset_config`), its dataset partitions, when it runs on its own (`automation`), when it is up to
date (`staleness`), and the executor its run's steps use."""

"""The user's registries every stage reads, below the stages: the registry files' reader and
overlay (`registry_files`), the dataset registry (`datasets`: datasets.yaml, with each
dataset's label scale and pipeline settings) and its relevance definitions (`relevance`)."""

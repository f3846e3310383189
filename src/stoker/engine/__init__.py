"""The machinery that turns index batches into collated batches.

``fetch`` holds the fetchers shared by the main process and the workers.
"""

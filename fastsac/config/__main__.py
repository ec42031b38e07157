"""`python -m fastsac.config`: print the config-key table (docs/configuration.md holds it)."""
from fastsac.config.key_table import config_keys_markdown

print(config_keys_markdown())

"""Operations helpers the commands and roles share, none of them part of
the protocol: daemon logging in the bisonbotkit format (:mod:`.botlog`),
per-data-directory and per-brclient locks (:mod:`.lockfile`), Go-compatible
JSON (:mod:`.gojson`), progress lines for long builds (:mod:`.progress`),
secret redaction for logs (:mod:`.redact`) and console output that survives
a closed pipe (:mod:`.console`). Private: import the public names from the
packages that re-export them.
"""

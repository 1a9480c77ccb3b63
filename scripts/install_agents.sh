#!/usr/bin/env bash
# Install the coding-agent CLIs the agent tests run, pinned, from npm, into one folder
# (default .cache/agents; the tests look there). Usage: scripts/install_agents.sh [DIR]
# AGENT_VERSIONS="claude=X codex=Y opencode=Z" overrides the pins (e.g. to try the newest).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.cache/agents}"
declare -A PIN=([claude]=2.1.328 [codex]=0.169.0 [opencode]=1.18.33)
for kv in ${AGENT_VERSIONS:-}; do PIN[${kv%%=*}]="${kv#*=}"; done
export DISABLE_AUTOUPDATER=1 npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-save --loglevel=error \
  "@anthropic-ai/claude-code@${PIN[claude]}" \
  "@openai/codex@${PIN[codex]}" \
  "opencode-ai@${PIN[opencode]}"
for bin in claude codex opencode; do "$DIR/node_modules/.bin/$bin" --version; done

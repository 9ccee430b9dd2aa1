"""The RL stage: rollouts, rewards, advantage estimators and policy/value losses (OpenRLHF's menu)."""

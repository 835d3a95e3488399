greeting = "hello from driftless"

package api

// What made the check a clock event reports (Event.Trigger).
const (
	// ClockTriggerGuestJump: the guest reported that its clock jumped.
	ClockTriggerGuestJump = "guest_jump"
	// ClockTriggerHostWake: the host's own clock jumped (it woke from
	// sleep, or its clock was set).
	ClockTriggerHostWake = "host_wake"
	// ClockTriggerInterval: the periodic check.
	ClockTriggerInterval = "interval"
)

package gateway

// PendingUpdates returns how many presence changes wait to be written to
// one connection of a user, and false when the gateway holds no such
// connection. Tests use it to see that a socket that does not read holds no
// more than the newest state of each user it watches.
func (s *Service) PendingUpdates(userID, connID string) (int, bool) {
	c := s.hub.findConn(userID, connID)
	if c == nil {
		return 0, false
	}
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return len(c.pending), true
}

// HoldRegistrations takes n of the MaxRegistering places, as n upgrades
// being registered would, until release is called.
func (s *Service) HoldRegistrations(n int) (release func()) {
	for range n {
		s.regSem <- struct{}{}
	}
	return func() {
		for range n {
			<-s.regSem
		}
	}
}

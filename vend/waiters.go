package vend

func (v *Vendor) wait(ref string) chan PaymentEvent {
	ch := make(chan PaymentEvent, 4)
	v.mu.Lock()
	v.waiters[ref] = append(v.waiters[ref], ch)
	v.mu.Unlock()
	return ch
}

func (v *Vendor) unwait(ref string, ch chan PaymentEvent) {
	v.mu.Lock()
	defer v.mu.Unlock()
	list := v.waiters[ref]
	for i, c := range list {
		if c == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(v.waiters, ref)
	} else {
		v.waiters[ref] = list
	}
}

// startRunning registers the call as running in this process and returns
// the channel stopRunning closes; nil if it runs already.
func (v *Vendor) startRunning(id CallID) chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, busy := v.running[id]; busy {
		return nil
	}
	done := make(chan struct{})
	v.running[id] = done
	return done
}

// stopRunning ends what startRunning registered, waking whoever waits.
func (v *Vendor) stopRunning(id CallID, done chan struct{}) {
	v.mu.Lock()
	delete(v.running, id)
	v.mu.Unlock()
	close(done)
}

func (v *Vendor) runningDone(id CallID) chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.running[id]
}

package agent

import (
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

func TestFollowNodeLeaving(t *testing.T) {
	st := cluster.NewStore()
	p := health.NewProgress(time.Minute, nil)
	followNodeLeaving(st, "n1", p)
	st.Upsert(&cluster.Node{Name: "n2", Leaving: true})
	if !p.State().NodeEligible {
		t.Error("another node leaving made this one ineligible")
	}
	st.Upsert(&cluster.Node{Name: "n1", Leaving: true})
	if p.State().NodeEligible {
		t.Error("this node leaving, still eligible")
	}
	st.Upsert(&cluster.Node{Name: "n1"})
	if !p.State().NodeEligible {
		t.Error("this node no longer leaving, still ineligible")
	}
	st.Delete(cluster.KindNode, cluster.Key{Name: "n1"})
	if p.State().NodeEligible {
		t.Error("this node deleted, still eligible")
	}
}

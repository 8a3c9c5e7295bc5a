package admin

import (
	"html/template"
	"sort"
	"strconv"
	"time"

	"github.com/capvend/capvend/vend"
)

// ChartDays is how many days (UTC, today included) the revenue chart
// spans.
const ChartDays = 30

// Chart is the revenue per day and account as an SVG bar chart, laid out
// on the server (no script draws it): one bar per day, stacked by
// account, income above the zero line and net refunds below it.
type Chart struct {
	Width, Height int
	ZeroY         int
	Top           vend.Msat // what the tallest bar reaches
	Days          []ChartDay
	Legend        []ChartLegend
}

// ChartDay is one day's bar.
type ChartDay struct {
	Day   string
	Label string // shown under every 5th day
	X, W  int
	Mid   int // the middle of its slot
	Total vend.Msat
	Bars  []ChartBar
}

// ChartBar is one account's part of a day's bar.
type ChartBar struct {
	Account string
	Amount  vend.Msat
	Y, H    int
	Color   string
}

// ChartLegend names an account's color.
type ChartLegend struct {
	Account string
	Color   string
}

// palette colors the accounts in the order of their names (and repeats).
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// chart lays out the last ChartDays days up to now of days.
func chart(now time.Time, days []DayRevenue) Chart {
	const w, h, left, right, bottom, top = 800, 220, 70, 20, 20, 10
	c := Chart{Width: w, Height: h}
	color := map[string]string{}
	var accounts []string
	for _, d := range days {
		if _, ok := color[d.Account]; !ok {
			color[d.Account] = ""
			accounts = append(accounts, d.Account)
		}
	}
	sort.Strings(accounts)
	for i, a := range accounts {
		color[a] = palette[i%len(palette)]
		c.Legend = append(c.Legend, ChartLegend{Account: a, Color: color[a]})
	}
	byDay := map[string][]DayRevenue{}
	for _, d := range days {
		byDay[d.Day] = append(byDay[d.Day], d)
	}
	first := now.UTC().AddDate(0, 0, 1-ChartDays)
	var up, down vend.Msat
	for i := range ChartDays {
		day := first.AddDate(0, 0, i).Format(time.DateOnly)
		var pos, neg vend.Msat
		for _, d := range byDay[day] {
			if d.Revenue > 0 {
				pos += d.Revenue
			} else {
				neg -= d.Revenue
			}
		}
		up, down = max(up, pos), max(down, neg)
	}
	c.Top = max(up, 1)
	span := float64(up + down)
	if span == 0 {
		span = 1
	}
	plot := float64(h - top - bottom)
	c.ZeroY = top + int(plot*float64(up)/span)
	slot := (w - left - right) / ChartDays
	for i := range ChartDays {
		t := first.AddDate(0, 0, i)
		cd := ChartDay{Day: t.Format(time.DateOnly), X: left + i*slot + 1, W: slot - 2, Mid: left + i*slot + slot/2}
		if i%5 == 4 || i == ChartDays-1 {
			cd.Label = t.Format("01-02")
		}
		yUp, yDown := c.ZeroY, c.ZeroY
		for _, d := range byDay[cd.Day] {
			cd.Total += d.Revenue
			hgt := int(plot*float64(abs(d.Revenue))/span + 0.5)
			b := ChartBar{Account: d.Account, Amount: d.Revenue, H: max(hgt, 1), Color: color[d.Account]}
			if d.Revenue >= 0 {
				yUp -= b.H
				b.Y = yUp
			} else {
				b.Y = yDown
				yDown += b.H
			}
			cd.Bars = append(cd.Bars, b)
		}
		c.Days = append(c.Days, cd)
	}
	return c
}

func abs(m vend.Msat) vend.Msat {
	if m < 0 {
		return -m
	}
	return m
}

// templateFuncs are the helpers the dashboard's templates use.
var templateFuncs = template.FuncMap{
	"sats": func(m vend.Msat) string { return string(m.AppendSats(nil)) },
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"dur": func(d time.Duration) string {
		switch {
		case d < time.Second:
			return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
		case d < time.Minute:
			return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
		default:
			return d.Round(time.Second).String()
		}
	},
	"short": func(s string) string {
		if len(s) <= 16 {
			return s
		}
		return s[:16] + "…"
	},
	"sub": func(a, b int) int { return a - b },
	"add": func(a, b int) int { return a + b },
	"diffs": func(runs []ReconcileRun) []Difference {
		var out []Difference
		for _, r := range runs {
			out = append(out, r.Differences...)
		}
		return out
	},
	"open": func(r ReconcileRun) int {
		n := 0
		for _, d := range r.Differences {
			if d.Repair == "" {
				n++
			}
		}
		return n
	},
}

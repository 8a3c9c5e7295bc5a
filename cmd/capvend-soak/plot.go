package main

import (
	"fmt"
	"image/color"
	"os"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// mark is a moment to draw across every panel (the relay's outage, the
// SIGHUP).
type mark struct {
	At   time.Duration
	Name string
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// line is one series of a panel.
type line struct {
	name   string
	y      func(Sample) float64 // negative: no point
	dashed bool
}

// panel is one plot of the figure.
type panel struct {
	title, ylabel string
	log           bool
	lines         []line
}

// writePlot draws the samples as a PNG at path: four panels sharing the
// time axis (memory; goroutines, files and open quotes; latencies; the
// ledger), the marks as vertical lines.
func writePlot(path, title string, ss []Sample, marks []mark) error {
	lat := func(k kind, p99 bool) func(Sample) float64 {
		return func(s Sample) float64 {
			if s.N[k] == 0 {
				return -1
			}
			if p99 {
				return ms(s.P99[k])
			}
			return ms(s.P50[k])
		}
	}
	panels := []panel{
		{title: title, ylabel: "memory (MiB)", lines: []line{
			{name: "RSS", y: func(s Sample) float64 { return nonneg(s.RSS, mib(s.RSS)) }},
			{name: "Go heap in use", y: func(s Sample) float64 { return nonneg(s.Heap, mib(s.Heap)) }},
		}},
		{ylabel: "count", lines: []line{
			{name: "goroutines", y: func(s Sample) float64 { return float64(s.Goroutines) }},
			{name: "open files", y: func(s Sample) float64 { return float64(s.FDs) }},
			{name: "open quotes", y: func(s Sample) float64 { return float64(s.OpenQuotes) }},
		}},
		{ylabel: "latency (ms, log)", log: true, lines: []line{
			{name: "free p50", y: lat(kFree, false), dashed: true}, {name: "free p99", y: lat(kFree, true)},
			{name: "paid p50", y: lat(kPaid, false), dashed: true}, {name: "paid p99", y: lat(kPaid, true)},
			{name: "credit p50", y: lat(kCredit, false), dashed: true}, {name: "credit p99", y: lat(kCredit, true)},
		}},
		{ylabel: "ledger (MiB)", lines: []line{
			{name: "file", y: func(s Sample) float64 { return mib(s.DB) }},
			{name: "WAL", y: func(s Sample) float64 { return mib(s.WAL) }},
			{name: "pages in use", y: func(s Sample) float64 { return nonneg(s.Used, mib(s.Used)) }},
		}},
	}
	rows := make([][]*plot.Plot, len(panels))
	end := 1.0
	if len(ss) > 0 {
		end = max(end, minutes(ss[len(ss)-1].At))
	}
	for i, pn := range panels {
		p, err := drawPanel(pn, ss, marks)
		if err != nil {
			return err
		}
		p.X.Min, p.X.Max = 0, end // one time axis for every panel
		if i == len(panels)-1 {
			p.X.Label.Text = "minutes since the load started"
		}
		rows[i] = []*plot.Plot{p}
	}
	img := vgimg.New(vg.Points(900), vg.Points(1300))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6), PadY: vg.Points(10)}
	canvases := plot.Align(rows, tiles, dc)
	for i := range rows {
		rows[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func nonneg(raw int64, v float64) float64 {
	if raw < 0 {
		return -1
	}
	return v
}

func drawPanel(pn panel, ss []Sample, marks []mark) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Y.Label.Text = pn.ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	if pn.log {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, ln := range pn.lines {
		var xys plotter.XYs
		for _, s := range ss {
			y := ln.y(s)
			if y < 0 || (pn.log && y <= 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: minutes(s.At), Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", ln.name, err)
		}
		c := palette[(i/2)%len(palette)]
		if !pn.log {
			c = palette[i%len(palette)]
		}
		l.Color, pts.Color = c, c
		pts.Radius = vg.Points(1.5)
		if ln.dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l, pts)
		p.Legend.Add(ln.name, l)
	}
	// The marks span the panel's y range as drawn so far.
	lo, hi := p.Y.Min, p.Y.Max
	if pn.log && lo <= 0 {
		lo = 1
	}
	if hi <= lo {
		hi = lo + 1
	}
	for j, m := range marks {
		v, err := plotter.NewLine(plotter.XYs{{X: minutes(m.At), Y: lo}, {X: minutes(m.At), Y: hi}})
		if err != nil {
			return nil, err
		}
		v.Color = color.Gray{Y: 0x80}
		v.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(v)
		if pn.title != "" {
			y := hi - float64(j%3)*(hi-lo)/12 // marks close together: their names one under the other
			lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: minutes(m.At), Y: y}}, Labels: []string{m.Name}})
			if err != nil {
				return nil, err
			}
			p.Add(lbl)
		}
	}
	return p, nil
}
